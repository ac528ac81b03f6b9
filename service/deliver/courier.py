"""One endpoint's deliveries in one deliverer: take tokens from the endpoint's shared
rate limit, claim that many due deliveries, POST each (at most ``concurrency`` at once),
and settle each by its answer (``core/webhook_policy.py``). Each endpoint has a courier of its
own, so a paused or slow endpoint holds up no other.

On SIGTERM a courier claims nothing more and settles the attempts in flight (each ends
within its endpoint's timeout), then returns.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

from service.adapters import postgres
from service.adapters.http.webhook_sender import Sender
from service.adapters.postgres import deliveries as rows
from service.adapters.telemetry.deliver_metrics import DeliverMetrics
from service.core import webhook_policy
from service.core.dead_letter import DeadLetterRecord
from service.core.default_owners import default_owner
from service.core.events import event_body
from service.core.webhook_policy import Answer, RetryPolicy, Verdict
from service.settings import Endpoint, Settings

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


def burst_of(endpoint: Endpoint) -> float:
    """The shared bucket's size: a tenth of a second's requests (at least one), so that
    the rate holds over any second, not only on average."""
    return max(1.0, endpoint.rate_per_second / 10)


@dataclass(eq=False)
class Courier:
    """Delivers to one endpoint until told to stop."""

    settings: Settings
    endpoint: Endpoint
    pool: postgres.Pool
    sender: Sender
    metrics: DeliverMetrics
    token: UUID = field(default_factory=uuid4)  # this deliverer's claims
    rng: Callable[[], float] = random.random
    in_flight: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def name(self) -> str:
        """The endpoint's name."""
        return self.endpoint.name

    async def run(self, stop: asyncio.Event) -> None:
        """Claim and deliver until ``stop``; then settle what is in flight."""
        limit = self.settings.webhook_concurrency
        while not stop.is_set():
            free = limit - len(self.in_flight)
            if free <= 0:
                await asyncio.wait(self.in_flight, return_when=asyncio.FIRST_COMPLETED)
                continue
            try:
                batch, wait = await self._claim(free)
            except Exception as exc:  # the database, mostly: the courier looks again
                log.warning(
                    "webhook.look_failed",
                    extra={"endpoint": self.name, "error_class": type(exc).__name__},
                )
                batch, wait = [], self.settings.webhook_poll_seconds
            for delivery in batch:
                task = asyncio.create_task(self._deliver(delivery))
                self.in_flight.add(task)
                task.add_done_callback(self.in_flight.discard)
            if wait > 0:
                await _sleep(stop, wait)
        if self.in_flight:
            await asyncio.wait(self.in_flight)

    async def _claim(self, free: int) -> tuple[list[rows.Delivery], float]:
        """Up to ``free`` due deliveries the rate limit allows now, and how long to wait
        before looking again."""
        endpoint, settings = self.endpoint, self.settings
        burst = burst_of(endpoint)
        async with self.pool.acquire() as conn:
            tokens = await rows.take_tokens(
                conn,
                self.name,
                rate=endpoint.rate_per_second,
                burst=burst,
                wanted=free,
                probe_seconds=settings.webhook_lease_seconds,
            )
            self.metrics.paused[self.name] = tokens.paused > 0
            if tokens.paused > 0:
                return [], min(tokens.paused, settings.webhook_poll_seconds)
            if tokens.granted == 0:
                self.metrics.rate_limited.add(1, {"endpoint": self.name})
                return [], max(0.001, (1 - tokens.have) / endpoint.rate_per_second)
            batch = await rows.claim(
                conn,
                self.name,
                tokens.granted,
                lease_seconds=settings.webhook_lease_seconds,
                token=self.token,
            )
            await rows.give_back(conn, self.name, tokens.granted - len(batch), burst=burst)
        self.metrics.looked()
        return batch, 0.0 if batch else settings.webhook_poll_seconds

    async def _deliver(self, delivery: rows.Delivery) -> None:
        body = event_body(delivery.reservation_id, delivery.hold_until, delivery.expired_at)
        started = time.monotonic()
        answer = await self.sender.post(delivery.message_id, body, datetime.now(UTC))
        self.metrics.attempt(
            self.name, answer.error_class or "delivered", time.monotonic() - started
        )
        try:
            settled = await self._settle(delivery, answer)
        except Exception as exc:  # the lease lapses: delivered again by the next claim
            settled = False
            log.warning(
                "webhook.settle_failed",
                extra={
                    "endpoint": self.name,
                    "message_id": delivery.message_id,
                    "error_class": type(exc).__name__,
                    "then": "its lease lapses and it is delivered again, with its webhook-id",
                },
            )
        if not settled:
            self.metrics.lapsed.add(1, {"endpoint": self.name})

    async def _settle(self, delivery: rows.Delivery, answer: Answer) -> bool:
        """Record the attempt's answer; False when the claim had lapsed (nothing of it is
        recorded: whoever claims it next delivers it again)."""
        attributes = {"endpoint": self.name}
        async with self.pool.acquire() as conn:
            if answer.status is not None and answer.verdict is not Verdict.RETRY:
                await rows.answered(conn, self.name)
            if answer.verdict is Verdict.DELIVERED:
                settled = await rows.delivered(conn, delivery.id, token=self.token)
                if settled:
                    self.metrics.delivered.add(1, attributes)
                return _said(settled, self.name, delivery)
            give_up = webhook_policy.PERMANENT
            delay = 0.0
            if answer.verdict is Verdict.RETRY:
                await self._failed(conn)
                policy = retry_policy(self.settings)
                delay = policy.delay(delivery.attempts + 1, answer, self.rng)
                give_up = policy.give_up(delivery.attempts + 1, delivery.age, delay) or ""
            error_class = answer.error_class or webhook_policy.UNAVAILABLE
            if not give_up:
                settled = await rows.put_off(
                    conn,
                    delivery.id,
                    token=self.token,
                    seconds=delay,
                    status=answer.status,
                    error_class=error_class,
                )
                if settled:
                    self.metrics.retried.add(1, {**attributes, "error_class": error_class})
                return _said(settled, self.name, delivery)
            settled = await rows.kill(
                conn,
                delivery.id,
                token=self.token,
                status=answer.status,
                dead_letter=self._dead_letter(delivery, answer, error_class, give_up),
                owner=default_owner(self.settings.dead_letter_owners, error_class),
            )
        if settled:
            self.metrics.dead.add(1, {**attributes, "error_class": error_class, "give_up": give_up})
            log.warning(
                "webhook.dead_letter",
                extra={
                    "endpoint": self.name,
                    "message_id": delivery.message_id,
                    "error_class": error_class,
                    "give_up": give_up,
                    "status": answer.status,
                },
            )
        return _said(settled, self.name, delivery)

    async def _failed(self, conn: postgres.Connection) -> None:
        settings = self.settings
        paused = await rows.failed(
            conn,
            self.name,
            pause_after=settings.webhook_pause_after,
            first=settings.webhook_pause_seconds,
            cap=settings.webhook_pause_cap_seconds,
        )
        if paused:
            self.metrics.paused[self.name] = True
            log.warning("webhook.paused", extra={"endpoint": self.name})

    def _dead_letter(
        self, delivery: rows.Delivery, answer: Answer, error_class: str, give_up: str
    ) -> DeadLetterRecord:
        now = datetime.now(UTC)
        return DeadLetterRecord(
            message_id=webhook_policy.dead_letter_key(self.name, delivery.message_id),
            reservation_id=delivery.reservation_id,
            hold_until=delivery.hold_until,
            error_class=error_class,
            give_up=give_up,
            reason=f"endpoint {self.name}: {answer.reason}",
            attempts=delivery.attempts + 1,
            first_seen=now - timedelta(seconds=delivery.age),
            last_seen=now,
            worker=self.settings.worker_id,
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


async def _sleep(stop: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds``, or less when ``stop`` is set meanwhile."""
    try:
        async with asyncio.timeout(seconds):
            await stop.wait()
    except TimeoutError:
        pass
