"""The consumer's router: one path for every delivery of the work queue.

A delivery is acked only after its guarded update committed. Whatever it
carries, and however it is batched or traced, it takes one path:

1. it is read into a ``Delivery`` (its headers are untrusted: bounded values);
2. its body is parsed: poison goes to ``Failures`` (dead-lettered);
3. a redelivered command is a suspect: ``Quarantine`` handles it alone;
4. any other command joins a batch (``Batcher``; a batch size of 1 is the
   per-message path); its outcome comes back by callback, and the delivery is
   acked (coalesced, or one at a time) and reported once, in one step
   (``Settler.ack``); a delivery its batch could not decide goes on alone;
5. a failure is retried or dead-lettered (``Failures``, which settles it the same
   way); anything unexpected rejects it for good, so that the broker dead-letters it.

Steps 2, 3 and 5 run in a task of the delivery's own; step 4 needs none, traced
or not. A traced delivery's consumer span starts when it arrives and ends when
its handling ends (``Delivery``): nothing waits for it, and the batch's database
span links to the spans of its deliveries.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from service.adapters.amqp.consuming import AmqpMessage
from service.adapters.telemetry import ConsumerTracing
from service.core.domain import Expiry, parse_command
from service.core.errors import PoisonMessage
from service.worker.acks import Acks
from service.worker.batcher import (
    Batcher,
    BatchFallback,
    ConsumerStopping,
    Item,
    Result,
    RowBusy,
)
from service.worker.delivery import Delivery
from service.worker.failpoints import Failpoints
from service.worker.failures import Failures
from service.worker.inflight import InFlight
from service.worker.ports import Store
from service.worker.quarantine import Quarantine
from service.worker.reporting import Reporter
from service.worker.settling import Settler


@dataclass(eq=False, kw_only=True)
class Consumer:
    """Routes each delivery of ``expirations`` to its one way of ending."""

    batcher: Batcher
    store: Store
    quarantine: Quarantine
    failures: Failures
    acks: Acks
    reporter: Reporter
    failpoints: Failpoints
    in_flight: InFlight
    tracing: ConsumerTracing | None = None  # None: no tracing, no span per delivery
    settler: Settler = field(init=False)

    def __post_init__(self) -> None:
        self.settler = Settler(self.acks, self.reporter)

    async def on_message(self, message: AmqpMessage) -> None:
        """The broker's callback: route the delivery (it never waits for its handling)."""
        delivery = Delivery.of(message, self.tracing)
        self.in_flight.begin()
        try:
            self._route(delivery)
        except Exception as exc:  # a bug before it was handed on: it must still be settled
            self._in_task(delivery, self.settler.bug(delivery, exc, "unhandled"))

    def _route(self, delivery: Delivery) -> None:
        try:
            command = parse_command(delivery.message.body)
        except PoisonMessage as poison:
            self._in_task(delivery, self.failures.handle(delivery, poison))
            return
        delivery.name(command.reservation_id)
        if delivery.message.redelivered:
            self._in_task(delivery, self._suspect(delivery))
            return
        self.failpoints.on_handling(command.reservation_id)
        self.batcher.put(
            Item(
                command.reservation_id,
                delivery.attempt.message_id,
                delivery.attempt.number,
                functools.partial(self._decided, delivery),
                delivery.span,
                traceparent=delivery.traceparent(),
            )
        )

    def _decided(self, delivery: Delivery, result: Result) -> None:
        """Its batch's answer (called from the batch's task)."""
        if isinstance(result, ConsumerStopping):
            self._end(delivery)  # never acked: the broker redelivers it
        elif isinstance(result, BaseException):
            self._in_task(delivery, self._alone(delivery, result))
        else:
            self._ack(delivery, result)

    async def _alone(self, delivery: Delivery, why: BaseException) -> None:
        """A delivery its batch could not decide, in a transaction of its own.

        One whose row another transaction held (``RowBusy``) is tried once more without
        waiting for the row, and only on a connection free for it, else it is retried
        later: a locked row never holds its place in the prefetch window, nor its
        neighbours' coalesced acks.
        """
        if delivery.reservation is None or not isinstance(why, BatchFallback):
            raise why  # e.g. an unknown reservation: a failure like any other
        busy = isinstance(why, RowBusy)
        expiry = await self.store.expire_one(
            delivery.reservation, delivery.attempt, busy=busy, traceparent=delivery.traceparent()
        )
        self._ack(delivery, expiry)

    async def _suspect(self, delivery: Delivery) -> None:
        assert delivery.reservation is not None  # parsed before it was routed here
        self._ack(delivery, await self.quarantine.expire(delivery, delivery.reservation))

    def _ack(self, delivery: Delivery, expiry: Expiry) -> None:
        """Committed: ack it (with its neighbours), then report it once, then end it."""
        self.failpoints.after_commit()
        self.settler.ack(delivery, expiry, then=self._end)

    def _in_task(self, delivery: Delivery, work: Coroutine[Any, Any, None]) -> None:
        """Handle it in a task of its own (in its consumer span's context when traced)."""
        task = asyncio.create_task(self._settle(delivery, work), context=delivery.task_context())
        self.in_flight.track(task)

    async def _settle(self, delivery: Delivery, work: Coroutine[Any, Any, None]) -> None:
        """Run the work; a failure is retried or dead-lettered; a bug rejects it for good."""
        try:
            await self._failing_over(delivery, work)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self.settler.bug(delivery, exc, type(exc).__name__)
        finally:
            if not delivery.ack_under_way:  # the ack, once sent, ends it
                self._end(delivery)

    async def _failing_over(self, delivery: Delivery, work: Coroutine[Any, Any, None]) -> None:
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if delivery.settled:
                raise
            await self.failures.handle(delivery, exc)

    def _end(self, delivery: Delivery) -> None:
        if delivery.end():
            self.in_flight.end()
