"""One delivery of an expiration command: domain -> database -> ack / retry / dead-letter.

A delivery is acked only after the guarded update committed. Two paths:

- the fast path (``_batch``): the first delivery of a valid command joins a
  batch and its task ends at once; the batch's task reports its outcome and
  acks it, coalesced with its neighbours into multiple-acks (``acks.py``);
- the full path (``handle``), in the delivery's own task: redelivered
  suspects, bodies that do not parse, batching off (batch size 1: one
  transaction and one ack per message) and traced deliveries (the consumer
  span then covers the whole job). A batched delivery its batch could not
  decide continues here too (``_alone``).

A failure is classified: a transient one is republished to a delay queue (a
fresh message carrying its attempt count in ``x-expiry-attempt``), a permanent
or exhausted one to ``expirations.dead`` with the metadata an operator needs;
the original is acked only after that copy was confirmed by the broker.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from aio_pika.abc import AbstractExchange, AbstractIncomingMessage
from opentelemetry import trace

from service.adapters import amqp, postgres
from service.adapters.amqp import messages
from service.adapters.classify import classify
from service.adapters.metrics import Metrics
from service.core.dead_letter import (
    ATTEMPT_HEADER,
    ERROR_CLASS_HEADER,
    FIRST_SEEN_HEADER,
    GIVE_UP_HEADER,
    LAST_SEEN_HEADER,
    REASON_HEADER,
    WORKER_HEADER,
    stable_message_id,
)
from service.core.domain import Outcome, parse_command
from service.core.errors import CrashLoop, PublishNotConfirmed, ServiceError
from service.core.inputs import (
    MAX_ATTEMPT,
    MESSAGE_ID_LIMIT,
    bounded_int,
    delivery_count,
    headers_of,
    recent_millis,
    text_of,
)
from service.core.retry import DeadLetter, GiveUp, Retry, RetryPolicy, decide
from service.core.topology import DEAD_ROUTING_KEY, QUEUE, retry_routing_key
from service.settings import Settings
from service.worker.acks import Acker, Done
from service.worker.batcher import Batcher, BatchFallback, ConsumerStopping, Item, Result
from service.worker.inflight import InFlight

log = logging.getLogger("service.consume")
tracer = trace.get_tracer("service.consume")

# Before returning a delivery whose copy was refused: 1, 2, 4, 8 s (by how often
# it came back), so that a queue refusing for a few seconds costs few rounds.
REQUEUE_PAUSE_SECONDS = 1.0
MAX_REQUEUE_PAUSE_SECONDS = 8.0
# A delivery whose retry or dead-letter copy the broker refused is returned to
# the queue (basic.reject, which every RabbitMQ version counts as a delivery);
# once it has been returned this often it is rejected for good instead, and
# the broker dead-letters it itself (at-least-once, to expirations.dead): the
# loop of refusals ends here, below the queue's delivery limit (10), whatever
# the broker version counts.
REFUSAL_LIMIT = 5
# Test-only failpoints (EXPIRY_FAILPOINT): "exit-after-commit" exits the process
# right after the first commit, before its ack, as a crash there would;
# "exit-on:<reservation uuid>" exits whenever that reservation's command is
# handled, like a message that kills every consumer that takes it.
FAILPOINT_EXIT_AFTER_COMMIT = "exit-after-commit"
FAILPOINT_EXIT_ON = "exit-on:"
# Counted attempts at a redelivered command before it is taken for one that
# kills its consumer (each crash also returns the deliveries the consumer
# held, one more delivery each, so this stays well under the delivery limit).
CRASH_LIMIT = 2


@dataclass(frozen=True)
class Attempt:
    """What a delivery says about its own history."""

    number: int
    first_seen_ms: int
    message_id: str


def read_attempt(message: AbstractIncomingMessage, now_ms: int) -> Attempt:
    """Read the attempt number and first-seen time from our headers (defaults: 1, now).

    Never raises: the headers are untrusted (``service.core.inputs``); a value out
    of bounds counts as absent.
    """
    headers = headers_of(message.headers)
    first_seen = recent_millis(headers.get(FIRST_SEEN_HEADER), now_ms)
    return Attempt(
        number=bounded_int(headers.get(ATTEMPT_HEADER), 1, MAX_ATTEMPT) or 1,
        first_seen_ms=now_ms if first_seen is None else min(now_ms, first_seen),
        message_id=text_of(message.message_id, MESSAGE_ID_LIMIT) or "-",
    )


def attempt_of(message: AbstractIncomingMessage) -> Attempt:
    """``read_attempt`` now; should it ever fail, a first attempt (the delivery must
    still be handled and settled)."""
    now = now_ms()
    try:
        return read_attempt(message, now)
    except Exception:
        log.exception("expiry.unreadable_headers")
        return Attempt(number=1, first_seen_ms=now, message_id="-")


@dataclass
class Delivery:
    """One delivery being handled: the message, what it says of itself, since when."""

    message: AbstractIncomingMessage
    attempt: Attempt
    started: float
    reservation: UUID | None = None  # once its body parsed
    settling: bool = False  # an ack, nack or reject was sent (or tried): never another

    @property
    def reservation_id(self) -> str:
        """The reservation as logged ("-" while unknown)."""
        return "-" if self.reservation is None else str(self.reservation)

    def elapsed(self) -> float:
        """Seconds since it arrived."""
        return time.monotonic() - self.started


def short_reason(exc: BaseException) -> str:
    """A reason safe to log and to store: our own messages, else only the error type."""
    if isinstance(exc, ServiceError):
        return str(exc)[:200]
    sqlstate = getattr(exc, "sqlstate", None)
    return f"{type(exc).__name__} (sqlstate {sqlstate})" if sqlstate else type(exc).__name__


def now_ms() -> int:
    """The worker's wall clock in epoch milliseconds (used only for retry budgets)."""
    return time.time_ns() // 1_000_000


class Consumer:
    """Handles deliveries of the ``expirations`` queue, each in its own task."""

    def __init__(
        self,
        settings: Settings,
        pool: postgres.Pool,
        retry_exchange: AbstractExchange,
        dead_exchange: AbstractExchange,
        in_flight: InFlight,
        metrics: Metrics,
        batcher: Batcher | None = None,
        acker: Acker | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.batcher = batcher
        self.acker = acker
        self.quarantine = asyncio.Lock()
        self.pool = pool
        self.retry_exchange = retry_exchange
        self.dead_exchange = dead_exchange
        self.policy = RetryPolicy(
            settings.retry_delays, settings.max_attempts, settings.max_age_seconds
        )
        self.in_flight = in_flight
        self._acquire_timeout = (
            settings.db_connect_timeout_seconds + settings.statement_timeout_ms / 1000
        )

    async def on_message(self, message: AbstractIncomingMessage) -> None:
        """The broker's callback: batched at once, or handled here (tracked for shutdown)."""
        try:
            batched = self._batch(message)
        except Exception:  # the full path settles it, whatever went wrong here
            log.exception("expiry.unhandled", extra={"message_id": _id_of(message)})
            batched = False
        if batched:
            return
        self.in_flight.track()
        await self.handle(message)

    def _batch(self, message: AbstractIncomingMessage) -> bool:
        """The fast path: the first delivery of a valid command joins a batch, and its
        task ends here; the batch acks and reports it (``_batched``).

        Everything else takes the full path, in the delivery's own task: a
        redelivered suspect, a body that does not parse, batching off, and a
        traced delivery (its consumer span must cover the whole job).
        """
        if self.batcher is None or message.redelivered or trace.get_current_span().is_recording():
            return False
        started = time.monotonic()
        try:
            command = parse_command(message.body)
        except Exception:  # the full path classifies it and dead-letters it
            return False
        attempt = attempt_of(message)
        if self.settings.failpoint:
            self._failpoint(FAILPOINT_EXIT_ON + str(command.reservation_id))
        delivery = Delivery(message, attempt, started, command.reservation_id)
        self.in_flight.begin()
        self.batcher.put(
            Item(
                command.reservation_id,
                attempt.message_id,
                attempt.number,
                None,
                trace.INVALID_SPAN_CONTEXT,
                on_result=functools.partial(self._batched, delivery),
            )
        )
        return True

    def _batched(self, delivery: Delivery, result: Result) -> None:
        """A batched delivery's outcome: acked with its neighbours, or handled alone."""
        if isinstance(result, ConsumerStopping):
            self.in_flight.end()  # never acked: the broker redelivers it
            return
        if isinstance(result, BaseException):
            self.in_flight.track(asyncio.create_task(self._alone(delivery, result)))
            self.in_flight.end()
            return
        self._failpoint(FAILPOINT_EXIT_AFTER_COMMIT)
        report = functools.partial(self._acked, delivery, result)
        if self.acker is not None:
            self.acker.ack_soon(delivery.message, report)
        else:
            self.in_flight.track(asyncio.create_task(self._ack_then(delivery.message, report)))

    async def _ack_then(self, message: AbstractIncomingMessage, report: Done) -> None:
        """Ack alone (no ``Acker``), then report; whatever happens, report once."""
        try:
            await message.ack()
        except Exception as exc:  # logged by the report as a settle failure
            report(exc)
        else:
            report(None)

    def _acked(
        self, delivery: Delivery, expiry: postgres.Expiry, exc: BaseException | None
    ) -> None:
        """Report a batched delivery once its ack was sent (or could not be)."""
        try:
            if exc is not None:
                amqp.settle_failed(exc, delivery.attempt.message_id)
            self._report(delivery, expiry, acked=exc is None)
        finally:
            self.in_flight.end()

    async def _alone(self, delivery: Delivery, why: BaseException) -> None:
        """A batched delivery its batch could not decide: alone, as the full path would."""
        await self._settled(delivery, self._conclude(delivery, self._alone_outcome(delivery, why)))

    async def _alone_outcome(self, delivery: Delivery, why: BaseException) -> postgres.Expiry:
        if delivery.reservation is None or not isinstance(why, BatchFallback):
            raise why  # e.g. an unknown reservation: classified like any other failure
        return await self.expire_alone(delivery.reservation, delivery.attempt)

    async def handle(self, message: AbstractIncomingMessage) -> None:
        """Process one delivery and settle it explicitly."""
        delivery = Delivery(message, attempt_of(message), time.monotonic())
        await self._settled(delivery, self._handle(delivery))

    async def _handle(self, delivery: Delivery) -> None:
        annotate_delivery(trace.get_current_span(), delivery.message, delivery.attempt)
        await self._conclude(delivery, self._outcome(delivery))

    async def _settled(self, delivery: Delivery, handling: Coroutine[Any, Any, None]) -> None:
        """Run a delivery's handling; if anything in it fails unexpectedly before the
        delivery was settled, reject it for good: the broker dead-letters it (at least
        once, to expirations.dead), so that it is recorded, never left unsettled."""
        try:
            await handling
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception(
                "expiry.unhandled",
                extra={
                    "reservation_id": delivery.reservation_id,
                    "message_id": delivery.attempt.message_id,
                    "settled": delivery.settling,
                },
            )
            if not delivery.settling:
                await self._reject_for_good(delivery, type(exc).__name__)

    async def _reject_for_good(self, delivery: Delivery, why: str) -> None:
        """``basic.reject(requeue=False)``: the work queue dead-letters it itself."""
        delivery.settling = True
        message = delivery.message
        if await amqp.settle(lambda: message.reject(requeue=False), delivery.attempt.message_id):
            self._settled_alone(message)
            log.warning(
                "expiry.dead_letter",
                extra={
                    "reservation_id": delivery.reservation_id,
                    "message_id": delivery.attempt.message_id,
                    "attempt": delivery.attempt.number,
                    "give_up": GiveUp.REJECTED.value,
                    "reason": why,
                },
            )

    async def _outcome(self, delivery: Delivery) -> postgres.Expiry:
        command = parse_command(delivery.message.body)
        delivery.reservation = command.reservation_id
        # the aio-pika instrumentation's consumer span
        trace.get_current_span().set_attribute("expiry.reservation_id", delivery.reservation_id)
        if delivery.message.redelivered:
            return await self.handle_suspect(
                command.reservation_id, delivery.attempt, delivery.message.body
            )
        self._failpoint(FAILPOINT_EXIT_ON + delivery.reservation_id)
        return await self.expire(command.reservation_id, delivery.attempt)

    async def _conclude(
        self, delivery: Delivery, work: Coroutine[Any, Any, postgres.Expiry]
    ) -> None:
        """Await the work on a delivery: ack and report its outcome, or retry / dead-letter."""
        try:
            expiry = await work
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self.on_failure(delivery, exc)
            return
        await self.finish(delivery, expiry)

    async def finish(self, delivery: Delivery, expiry: postgres.Expiry) -> None:
        """Ack a committed delivery, then report it (even when cancelled during the ack)."""
        self._failpoint(FAILPOINT_EXIT_AFTER_COMMIT)
        acked = False
        delivery.settling = True
        try:
            acked = await amqp.settle(
                self._ack_action(delivery.message), delivery.attempt.message_id
            )
        finally:  # cancelled with its channel during the ack: the effect still happened
            trace.get_current_span().set_attribute("expiry.outcome", expiry.outcome.value)
            self._report(delivery, expiry, acked=acked)

    def _report(self, delivery: Delivery, expiry: postgres.Expiry, *, acked: bool) -> None:
        elapsed = delivery.elapsed()
        self.metrics.outcome(expiry.outcome, seconds=elapsed, lag=expiry.lag_seconds)
        _log_outcome(delivery, expiry.outcome, elapsed, acked=acked)

    async def handle_suspect(
        self, reservation_id: UUID, attempt: Attempt, body: bytes
    ) -> postgres.Expiry:
        """A redelivered command: someone held it and did not settle it (maybe it killed them).

        Suspects go one at a time and alone, each attempt counted in the database
        first: past ``CRASH_LIMIT`` counted attempts the command is dead-lettered
        (``CrashLoop``) instead of crashing consumers until the broker's delivery
        limit, taking the deliveries they hold with it each time.
        """
        key = stable_message_id(None if attempt.message_id == "-" else attempt.message_id, body)
        async with self.quarantine:
            async with self.pool.acquire(timeout=self._acquire_timeout) as conn:
                handled = await postgres.mark_handling(conn, key)
            if handled > CRASH_LIMIT:
                raise CrashLoop(f"a consumer died handling it {handled - 1} times")
            self._failpoint(FAILPOINT_EXIT_ON + str(reservation_id))
            expiry = await self.expire_alone(reservation_id, attempt)
            async with self.pool.acquire(timeout=self._acquire_timeout) as conn:
                await postgres.clear_handling(conn, key)
            return expiry

    async def expire(self, reservation_id: UUID, attempt: Attempt) -> postgres.Expiry:
        """The guarded update and its audit row: in a batch, or alone when that fails."""
        if self.batcher is not None:
            try:
                return await self.batcher.submit(reservation_id, attempt.message_id, attempt.number)
            except BatchFallback:
                pass
        return await self.expire_alone(reservation_id, attempt)

    async def expire_alone(self, reservation_id: UUID, attempt: Attempt) -> postgres.Expiry:
        """The guarded update and its audit row, in a transaction of its own."""
        with tracer.start_as_current_span(
            "expire reservation", attributes={"db.system": "postgresql"}
        ) as span:
            async with self.pool.acquire(timeout=self._acquire_timeout) as conn:
                expiry = await postgres.expire_reservation(
                    conn,
                    reservation_id,
                    message_id=attempt.message_id,
                    attempt=attempt.number,
                    worker=self.settings.worker_id,
                )
            span.set_attribute("expiry.outcome", expiry.outcome.value)
            return expiry

    async def on_failure(self, delivery: Delivery, exc: Exception) -> None:
        """Retry through a delay queue or dead-letter; ack only once the copy is confirmed."""
        message, attempt = delivery.message, delivery.attempt
        disposition, error_class = classify(exc)
        age = (now_ms() - attempt.first_seen_ms) / 1000
        decision = decide(self.policy, disposition, attempt=attempt.number, age_seconds=age)
        span = trace.get_current_span()
        span.set_attribute("expiry.error_class", error_class)
        span.set_attribute(
            "expiry.outcome", "retry" if isinstance(decision, Retry) else "dead-letter"
        )
        facts = {
            "reservation_id": delivery.reservation_id,
            "message_id": attempt.message_id,
            "attempt": attempt.number,
            "error_class": error_class,
            "reason": short_reason(exc),
            "elapsed_ms": round(delivery.elapsed() * 1000, 1),
        }
        try:
            await self.publish_copy(message, attempt, decision, error_class, short_reason(exc))
        except PublishNotConfirmed as publish_exc:
            await self._copy_refused(delivery, facts, str(publish_exc))
            return
        delivery.settling = True
        acked = await amqp.settle(message.ack, attempt.message_id)
        self._settled_alone(message)
        if not acked:
            return
        elapsed = delivery.elapsed()
        if isinstance(decision, Retry):
            self.metrics.retried(error_class, seconds=elapsed)
            log.info("expiry.retry", extra={**facts, "delay_s": decision.delay_seconds})
        else:
            self.metrics.dead_lettered(error_class, decision.why.value, seconds=elapsed)
            log.warning("expiry.dead_letter", extra={**facts, "give_up": decision.why.value})

    async def _copy_refused(self, delivery: Delivery, facts: dict[str, Any], why: str) -> None:
        """The broker refused the retry or dead-letter copy: return the delivery to the
        queue after a pause, or, once it has come back ``REFUSAL_LIMIT`` times, reject it
        for good (the broker dead-letters it)."""
        message = delivery.message
        returned = delivery_count(
            headers_of(message.headers), redelivered=bool(message.redelivered)
        )
        if returned + 1 >= REFUSAL_LIMIT:
            log.warning("expiry.copy_failed", extra={**facts, "copy_error": why, "final": True})
            await self._reject_for_good(delivery, f"copy refused {returned + 1} times: {why}")
            return
        log.warning("expiry.copy_failed", extra={**facts, "copy_error": why})
        await asyncio.sleep(
            min(REQUEUE_PAUSE_SECONDS * 2 ** min(returned, 8), MAX_REQUEUE_PAUSE_SECONDS)
        )
        delivery.settling = True
        await amqp.settle(lambda: message.reject(requeue=True), delivery.attempt.message_id)
        self._settled_alone(message)

    async def publish_copy(
        self,
        message: AbstractIncomingMessage,
        attempt: Attempt,
        decision: Retry | DeadLetter,
        error_class: str,
        reason: str,
    ) -> None:
        """Publish the retry or dead-letter copy of ``message`` and wait for its confirm."""
        headers: dict[str, Any] = {
            FIRST_SEEN_HEADER: attempt.first_seen_ms,
            ERROR_CLASS_HEADER: error_class,
            REASON_HEADER: reason,
            WORKER_HEADER: self.settings.worker_id,
        }
        if isinstance(decision, Retry):
            headers[ATTEMPT_HEADER] = decision.next_attempt
            exchange, routing_key = self.retry_exchange, retry_routing_key(decision.delay_seconds)
        else:
            headers[ATTEMPT_HEADER] = attempt.number
            headers[GIVE_UP_HEADER] = decision.why.value
            headers[LAST_SEEN_HEADER] = now_ms()
            exchange, routing_key = self.dead_exchange, DEAD_ROUTING_KEY
        await amqp.publish_confirmed(
            exchange,
            messages.copy_of(message, headers),
            routing_key,
            timeout=self.settings.publish_timeout_seconds,
        )

    def _ack_action(self, message: AbstractIncomingMessage) -> Callable[[], Awaitable[None]]:
        """How to ack a committed delivery: coalesced with its neighbours, or alone."""
        if self.acker is None:
            return message.ack
        acker = self.acker
        return lambda: acker.ack(message)

    def _settled_alone(self, message: AbstractIncomingMessage) -> None:
        if self.acker is not None:
            self.acker.settled(message)

    def _failpoint(self, name: str) -> None:
        if self.settings.failpoint and self.settings.failpoint.lower() == name:
            log.warning("expiry.failpoint", extra={"failpoint": self.settings.failpoint})
            logging.shutdown()
            os._exit(137)


def annotate_delivery(span: trace.Span, message: AbstractIncomingMessage, attempt: Attempt) -> None:
    """Messaging semantic-convention attributes, and our attempt, on the consumer span."""
    if not span.is_recording():
        return
    span.set_attributes(
        {
            "messaging.system": "rabbitmq",
            "messaging.operation.type": "process",
            "messaging.destination.name": QUEUE,
            "messaging.message.id": attempt.message_id,
            "messaging.rabbitmq.destination.routing_key": message.routing_key or "",
            "messaging.rabbitmq.message.redelivered": bool(message.redelivered),
            "expiry.attempt": attempt.number,
        }
    )


def _log_outcome(delivery: Delivery, outcome: Outcome, elapsed: float, *, acked: bool) -> None:
    log.info(
        "expiry.outcome",
        extra={
            "reservation_id": delivery.reservation_id,
            "message_id": delivery.attempt.message_id,
            "attempt": delivery.attempt.number,
            "outcome": outcome.value,
            "redelivered": bool(delivery.message.redelivered),
            "acked": acked,
            "elapsed_ms": round(elapsed * 1000, 1),
        },
    )


def _id_of(message: AbstractIncomingMessage) -> str:
    return text_of(message.message_id, MESSAGE_ID_LIMIT) or "-"
