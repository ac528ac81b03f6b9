"""Settling one attempt by its answer (``core/webhook_policy.py``), only while the
claim's lease holds: delivered (the row deleted, in one statement with the others
answered meanwhile: ``receipts.py``), put off (tried again later; after a 410 Gone, once
the endpoint is enabled again), or dead once out of attempts or age (a dead letter in
``dead_letters``, its delivery kept for a replay); and the endpoint's shared state
(failures in a row and its pause, the hold its ``Retry-After`` asks for, disabled) and
the metrics with it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from uuid import UUID

from service.adapters import postgres
from service.adapters.postgres import deliveries as rows
from service.adapters.postgres import webhook_endpoints as endpoints
from service.adapters.telemetry.deliver_metrics import DeliverMetrics
from service.core import webhook_policy
from service.core.dead_letter import DeadLetterRecord
from service.core.default_owners import default_owner
from service.core.webhook_policy import Answer, RetryPolicy, Verdict
from service.deliver.receipts import Receipts
from service.settings import Settings

log = logging.getLogger("service.deliver")


def retry_policy(settings: Settings) -> RetryPolicy:
    """The retry policy the settings give."""
    return RetryPolicy(
        max_attempts=settings.webhook_max_attempts,
        max_age_seconds=settings.webhook_max_age_seconds,
        backoff_seconds=settings.webhook_backoff_seconds,
        backoff_cap_seconds=settings.webhook_backoff_cap_seconds,
        retry_after_cap_seconds=settings.webhook_retry_after_cap_seconds,
    )


@dataclass(eq=False)
class Bookkeeper:
    """Settles one endpoint's attempts for one deliverer (its claims' ``token``)."""

    settings: Settings
    endpoint: str
    pool: postgres.Pool
    metrics: DeliverMetrics
    token: UUID
    rng: Callable[[], float]

    def __post_init__(self) -> None:
        self.receipts = Receipts(self.endpoint, self.pool, self.metrics, self.token)

    def delivered(
        self, delivery: rows.Delivery, answer: Answer, *, seconds: float, probe: bool = False
    ) -> None:
        """A 2xx: recorded with the others answered meanwhile (``receipts.py``, which
        counts it, or says its lapse)."""
        self.receipts.add(delivery, self._attempted(delivery, answer, seconds, probe))

    async def settle(
        self, delivery: rows.Delivery, answer: Answer, *, seconds: float, probe: bool = False
    ) -> bool:
        """A failure: record the attempt (in the attempt log, whatever else) and its
        answer; False when the claim had lapsed (then the delivery is left as it was:
        whoever claims it next delivers it again)."""
        attempted = self._attempted(delivery, answer, seconds, probe)
        async with self.pool.acquire() as conn:
            if answer.verdict is Verdict.GONE:
                return await self._gone(conn, delivery, answer, attempted)
            return await self._failed(conn, delivery, answer, attempted)

    def _attempted(
        self, delivery: rows.Delivery, answer: Answer, seconds: float, probe: bool
    ) -> rows.Attempted:
        """The attempt as the attempt log keeps it."""
        return rows.Attempted(
            endpoint=self.endpoint,
            message_id=delivery.message_id,
            number=delivery.attempts + 1,
            kind=rows.PROBE if probe else delivery.origin,
            status=answer.status,
            error_class=answer.error_class,
            duration_ms=round(seconds * 1000, 3),
            deliverer=self.settings.worker_id,
        )

    async def _gone(
        self,
        conn: postgres.Connection,
        delivery: rows.Delivery,
        answer: Answer,
        attempted: rows.Attempted,
    ) -> bool:
        """410 Gone: the endpoint disabled; the delivery waits for it to be enabled."""
        if await endpoints.disable(conn, self.endpoint):
            log.warning(
                "webhook.disabled",
                extra={
                    "endpoint": self.endpoint,
                    "status": answer.status,
                    "then": "nothing is sent to it until python -m service.deliver --enable",
                },
            )
        return await self._put_off(conn, delivery, attempted, 0.0)

    async def _failed(
        self,
        conn: postgres.Connection,
        delivery: rows.Delivery,
        answer: Answer,
        attempted: rows.Attempted,
    ) -> bool:
        """A failure: counted in a row (a pause), the endpoint held for its Retry-After,
        and the delivery tried again on the backoff, or dead once out of budget."""
        settings = self.settings
        if await endpoints.failed(
            conn,
            self.endpoint,
            pause_after=settings.webhook_pause_after,
            first=settings.webhook_pause_seconds,
            cap=settings.webhook_pause_cap_seconds,
        ):
            log.warning("webhook.paused", extra={"endpoint": self.endpoint})
        policy = retry_policy(settings)
        if (hold := policy.hold(answer)) > 0:
            await endpoints.hold(conn, self.endpoint, hold)
        delay = policy.delay(delivery.attempts + 1, answer, self.rng)
        give_up = policy.give_up(delivery.attempts + 1, delivery.age, delay)
        if give_up is None:
            return await self._put_off(conn, delivery, attempted, delay)
        return await self._kill(conn, delivery, answer, attempted, give_up)

    async def _put_off(
        self,
        conn: postgres.Connection,
        delivery: rows.Delivery,
        attempted: rows.Attempted,
        delay: float,
    ) -> bool:
        settled = await rows.put_off(
            conn, delivery.id, token=self.token, seconds=delay, attempted=attempted
        )
        if settled:
            error_class = attempted.error_class or webhook_policy.UNAVAILABLE
            self.metrics.retried.add(1, {"endpoint": self.endpoint, "error_class": error_class})
        return _said(settled, self.endpoint, delivery)

    async def _kill(
        self,
        conn: postgres.Connection,
        delivery: rows.Delivery,
        answer: Answer,
        attempted: rows.Attempted,
        give_up: str,
    ) -> bool:
        error_class = answer.error_class or webhook_policy.UNAVAILABLE
        settled = await rows.kill(
            conn,
            delivery.id,
            token=self.token,
            attempted=attempted,
            dead_letter=_dead_letter(attempted, delivery, answer, error_class, give_up),
            owner=default_owner(self.settings.dead_letter_owners, error_class),
        )
        if settled:
            self.metrics.dead.add(
                1, {"endpoint": self.endpoint, "error_class": error_class, "give_up": give_up}
            )
            log.warning(
                "webhook.dead_letter",
                extra={
                    "endpoint": self.endpoint,
                    "message_id": delivery.message_id,
                    "error_class": error_class,
                    "give_up": give_up,
                    "status": answer.status,
                },
            )
        return _said(settled, self.endpoint, delivery)


def _dead_letter(
    attempted: rows.Attempted,
    delivery: rows.Delivery,
    answer: Answer,
    error_class: str,
    give_up: str,
) -> DeadLetterRecord:
    """The dead letter of a delivery out of attempts or age, after this attempt."""
    now = datetime.now(UTC)
    return DeadLetterRecord(
        message_id=webhook_policy.dead_letter_key(attempted.endpoint, delivery.message_id),
        reservation_id=delivery.reservation_id,
        hold_until=delivery.hold_until,
        error_class=error_class,
        give_up=give_up,
        reason=f"endpoint {attempted.endpoint}: {answer.reason}",
        attempts=attempted.number,
        first_seen=now - timedelta(seconds=delivery.age),
        last_seen=now,
        worker=attempted.deliverer,
        body_excerpt=None,
    )


def _said(settled: bool, endpoint: str, delivery: rows.Delivery) -> bool:
    """A settle that found its lease lapsed is said loudly: the attempt counts for
    nothing and the delivery is made again (the receiver dedupes by webhook-id)."""
    if not settled:
        log.warning(
            "webhook.lease_lapsed",
            extra={"endpoint": endpoint, "message_id": delivery.message_id},
        )
    return settled
