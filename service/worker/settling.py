"""How a delivery ends: the broker's ack or reject, then its report, in one step.

Every way a delivery of the work queue ends passes here, once: acked with its
neighbours after its commit (``ack``); or settled alone (``settle``): acked once its
retry or dead-letter copy is confirmed (``Copied``); because the broker refused its copy
(``Refused``), returned to the queue or, refused too often, rejected for good; or,
after a bug in its handling, rejected for good (``Rejected``): the work queue then
dead-letters it itself. The delivery's ``Stage`` says it is settled,
and what was settled is reported (``Reporter``) only after the broker was told.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from service.adapters import amqp
from service.core.domain import Expiry
from service.core.retry import Requeue
from service.worker.acks import Acks
from service.worker.delivery import Delivery
from service.worker.endings import Copied, Ending, Refused, Rejected
from service.worker.reporting import Reporter


class Settler:
    """Settles deliveries (never one twice) and reports each once the broker was told."""

    def __init__(self, acks: Acks, reporter: Reporter) -> None:
        self.acks = acks
        self.reporter = reporter

    async def settle(self, delivery: Delivery, ending: Ending) -> None:
        """Ack or reject the delivery alone, as ``ending`` says; then report it."""
        delivery.settling()
        message = delivery.message
        action: amqp.SettleAction
        if isinstance(ending, Copied):
            action = message.ack
        else:
            back = isinstance(ending, Refused) and isinstance(ending.then, Requeue)
            action = functools.partial(message.reject, requeue=back)
        sent = await amqp.settle(action, delivery.attempt.message_id)
        self.acks.settled(message)
        self.reporter.ended(delivery, ending, sent=sent)

    async def bug(self, delivery: Delivery, exc: BaseException, why: str) -> None:
        """A bug in its handling: reported with its traceback; and, unless it was settled
        already, rejected for good (``why``), so that the broker dead-letters it."""
        self.reporter.unhandled(delivery, exc)
        if not delivery.settled:
            await self.settle(delivery, Rejected(why))

    def ack(self, delivery: Delivery, expiry: Expiry, then: Callable[[Delivery], None]) -> None:
        """Committed: ack it with its neighbours, report it once the frame is sent (or
        could not be: its channel is gone, the broker redelivers it), then ``then``."""
        delivery.acking()
        self.acks.ack_soon(delivery.message, functools.partial(self._acked, delivery, expiry, then))

    def _acked(
        self,
        delivery: Delivery,
        expiry: Expiry,
        then: Callable[[Delivery], None],
        exc: BaseException | None,
    ) -> None:
        try:
            if exc is not None:
                amqp.settle_failed(exc, delivery.attempt.message_id)
            self.reporter.expired(delivery, expiry, acked=exc is None)
        finally:
            then(delivery)
