"""A delivery that failed: retried through a delay tier, or dead-lettered, with its
history in our headers; the original is acked only once the copy is confirmed.

A retry goes to one of its tier's slot queues, picked here at random (the
decision itself is pure), so that commands that failed together come back
spread over the tier's jitter window, none later than the tier's bound.

A copy the broker refuses returns the delivery to the queue (``basic.reject``,
which every RabbitMQ version counts as a delivery) after a pause of 1, 2, 4,
8 s; once it has been returned ``REFUSAL_LIMIT`` times it is rejected for good
instead, and the work queue's own at-least-once dead-lettering takes it to
``expirations.dead``: the loop of refusals ends below the queue's delivery
limit (10), whatever the broker version counts. Rejecting for good is also the
last resort for a delivery whose handling failed in any unexpected way.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from service.adapters import amqp
from service.adapters.amqp import messages
from service.adapters.classify import classify
from service.core.dead_letter import (
    ATTEMPT_HEADER,
    ERROR_CLASS_HEADER,
    FIRST_SEEN_HEADER,
    GIVE_UP_HEADER,
    LAST_SEEN_HEADER,
    REASON_HEADER,
    WORKER_HEADER,
)
from service.core.errors import PublishNotConfirmed
from service.core.inputs import delivery_count, headers_of
from service.core.retry import DeadLetter, Retry, RetryPolicy, decide
from service.settings import Settings
from service.worker.acks import Acks
from service.worker.delivery import Delivery, now_ms, short_reason
from service.worker.ports import Publisher
from service.worker.reporting import Reporter

REQUEUE_PAUSE_SECONDS = 1.0
MAX_REQUEUE_PAUSE_SECONDS = 8.0
REFUSAL_LIMIT = 5


class Failures:
    """Decides and carries out what follows a failed delivery."""

    def __init__(
        self, settings: Settings, publisher: Publisher, acks: Acks, reporter: Reporter
    ) -> None:
        self.worker = settings.worker_id
        self.policy = RetryPolicy(
            settings.retry_delays,
            settings.max_attempts,
            settings.max_age_seconds,
            jitter=settings.retry_jitter,
            slots=settings.retry_jitter_slots,
        )
        self.publisher = publisher
        self.acks = acks
        self.reporter = reporter

    async def handle(self, delivery: Delivery, exc: Exception) -> None:
        """Retry through a delay queue or dead-letter; ack only once the copy is confirmed."""
        disposition, error_class = classify(exc)
        age = (now_ms() - delivery.attempt.first_seen_ms) / 1000
        number = delivery.attempt.number
        decision = decide(
            self.policy, disposition, attempt=number, age_seconds=age, draw=random.random()
        )
        self.reporter.failed(delivery, exc, error_class, decision)
        facts = {
            "reservation_id": delivery.reservation_id,
            "message_id": delivery.attempt.message_id,
            "attempt": number,
            "error_class": error_class,
            "reason": short_reason(exc),
            "elapsed_ms": round(delivery.elapsed() * 1000, 1),
        }
        try:
            await self._publish_copy(delivery, decision, error_class, short_reason(exc))
        except PublishNotConfirmed as refused:
            await self._copy_refused(delivery, facts, str(refused))
            return
        if await self._settle(delivery, delivery.message.ack):
            self.reporter.copied(delivery, decision, facts)

    async def reject_for_good(self, delivery: Delivery, why: str) -> None:
        """``basic.reject(requeue=False)``: the work queue dead-letters it itself."""
        message = delivery.message
        if await self._settle(delivery, lambda: message.reject(requeue=False)):
            self.reporter.rejected(delivery, why)

    async def _publish_copy(
        self, delivery: Delivery, decision: Retry | DeadLetter, error_class: str, reason: str
    ) -> None:
        attempt = delivery.attempt
        headers: dict[str, Any] = {
            FIRST_SEEN_HEADER: attempt.first_seen_ms,
            ERROR_CLASS_HEADER: error_class,
            REASON_HEADER: reason,
            WORKER_HEADER: self.worker,
        }
        if isinstance(decision, Retry):
            headers[ATTEMPT_HEADER] = decision.next_attempt
            copy = messages.copy_of(delivery.message, headers)
            await self.publisher.retry(copy, decision.delay_ms)
        else:
            headers[ATTEMPT_HEADER] = attempt.number
            headers[GIVE_UP_HEADER] = decision.why.value
            headers[LAST_SEEN_HEADER] = now_ms()
            await self.publisher.dead_letter(messages.copy_of(delivery.message, headers))

    async def _copy_refused(self, delivery: Delivery, facts: dict[str, Any], why: str) -> None:
        message = delivery.message
        returned = delivery_count(
            headers_of(message.headers), redelivered=bool(message.redelivered)
        )
        if returned + 1 >= REFUSAL_LIMIT:
            self.reporter.copy_refused(facts, why, final=True)
            await self.reject_for_good(delivery, f"copy refused {returned + 1} times: {why}")
            return
        self.reporter.copy_refused(facts, why, final=False)
        pause = REQUEUE_PAUSE_SECONDS * 2 ** min(returned, 8)
        await asyncio.sleep(min(pause, MAX_REQUEUE_PAUSE_SECONDS))
        await self._settle(delivery, lambda: message.reject(requeue=True))

    async def _settle(self, delivery: Delivery, action: amqp.SettleAction) -> bool:
        """Ack or reject the delivery itself (never twice); tell the acks it is settled."""
        delivery.settling()
        settled = await amqp.settle(action, delivery.attempt.message_id)
        self.acks.settled(delivery.message)
        return settled
