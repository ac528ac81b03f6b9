"""A delivery that failed: retried through a delay tier, or dead-lettered, with its
history in our headers; the original is acked only once the copy is confirmed.

The way down is one: the failure is classified and decided (``core.retry``, pure), its
copy published with a confirm, and the delivery settled and reported in one step
(``settling.Settler``). A retry goes to one of its tier's slot queues, picked here at
random (the decision itself is pure), so that commands that failed together come back
spread over the tier's jitter window, none later than the tier's bound.

A copy the broker refuses returns the delivery to the queue (``basic.reject``, which
every RabbitMQ version counts as a delivery) after a pause, until it has been returned
``core.retry.REFUSAL_LIMIT`` times; then it is rejected for good, and the work queue's
own at-least-once dead-lettering takes it to ``expirations.dead``. Rejecting for good is
also the last resort for a delivery whose handling failed in any unexpected way.
"""

from __future__ import annotations

import asyncio
import random

from service.adapters.amqp import messages
from service.adapters.classify import classify
from service.core.dead_letter import copy_headers
from service.core.errors import PublishNotConfirmed
from service.core.inputs import delivery_count, headers_of
from service.core.retry import Requeue, Retry, RetryPolicy, after_refusal, decide
from service.settings import Settings
from service.worker.acks import Acks
from service.worker.delivery import Delivery, now_ms, short_reason
from service.worker.endings import Copied, Failure, Refused
from service.worker.ports import Publisher
from service.worker.reporting import Reporter
from service.worker.settling import Settler


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
        self.settler = Settler(acks, reporter)

    async def handle(self, delivery: Delivery, exc: Exception) -> None:
        """Retry through a delay queue or dead-letter; ack only once the copy is confirmed."""
        failure = self._failure(delivery, exc)
        try:
            await self._publish_copy(delivery, failure)
        except PublishNotConfirmed as refused:
            message = delivery.message
            returned = delivery_count(
                headers_of(message.headers), redelivered=bool(message.redelivered)
            )
            then = after_refusal(returned, str(refused))
            if isinstance(then, Requeue):
                await asyncio.sleep(then.pause_seconds)
            await self.settler.settle(delivery, Refused(failure, str(refused), then))
            return
        await self.settler.settle(delivery, Copied(failure))

    def _failure(self, delivery: Delivery, exc: Exception) -> Failure:
        """The failure classified, and what follows it decided."""
        disposition, error_class = classify(exc)
        age = (now_ms() - delivery.attempt.first_seen_ms) / 1000
        decision = decide(
            self.policy,
            disposition,
            attempt=delivery.attempt.number,
            age_seconds=age,
            draw=random.random(),
        )
        return Failure(exc, error_class, short_reason(exc), decision)

    async def _publish_copy(self, delivery: Delivery, failure: Failure) -> None:
        attempt = delivery.attempt
        headers = copy_headers(
            failure.decision,
            attempt=attempt.number,
            first_seen_ms=attempt.first_seen_ms,
            error_class=failure.error_class,
            reason=failure.reason,
            worker=self.worker,
            now_ms=now_ms(),
        )
        copy = messages.copy_of(delivery.message, headers)
        if isinstance(failure.decision, Retry):
            await self.publisher.retry(copy, failure.decision.delay_ms)
        else:
            await self.publisher.dead_letter(copy)
