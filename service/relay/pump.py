"""The relay's work: claim pending events, publish them with confirms, mark them sent.

One batch: claim up to ``EXPIRY_RELAY_BATCH_SIZE`` of the oldest events no lease holds,
with a fresh token and a lease of ``EXPIRY_RELAY_LEASE_SECONDS`` (two relays never claim
the same one); publish them as one page, each confirmed, returned or refused alone
(``PagePublisher``, mandatory: an event that no queue would take is returned, never
confirmed); mark the confirmed ones sent, which matches only while the claim's lease
holds; give back the others at once. A drain repeats that while batches come back
full; then the relay waits for a wake-up (NOTIFY) or its poll.

What was published but not marked (a relay killed in between, a lease that lapsed, a
database that went away) is claimed again later and published again with the same
message ids: readers deduplicate by them (../shared/CONTRACT.md, "Events").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import asyncpg

from service.adapters import postgres
from service.adapters.amqp.page_publisher import Command, PagePublisher
from service.adapters.classify import classify, schema_missing
from service.adapters.postgres.outbox import (
    PendingEvent,
    claim_events,
    mark_sent,
    release_claim,
)
from service.adapters.telemetry.relay_metrics import UNROUTABLE, RelayMetrics
from service.core.events import event_body
from service.relay.exit_points import NO_EXITS, NoExits
from service.relay.ledger import Batch, Ledger
from service.settings import Settings

log = logging.getLogger("service.relay")

# After a batch that failed (the broker returned, refused or did not confirm its events,
# or the database went away) the relay waits before it tries again: 1 s, then twice as
# long each time, up to this; a batch that succeeds starts it over.
PAUSE_FIRST_SECONDS = 1.0
PAUSE_MAX_SECONDS = 30.0


@dataclass
class PumpHealth:
    """Whether the relay's looks into the outbox succeed (its readiness)."""

    stall_seconds: float
    last_ok: bool = True  # until a look ends, the relay is starting
    last_ok_at: float = field(default_factory=time.monotonic)

    def succeeded(self) -> None:
        """A batch, or a look that found nothing, succeeded."""
        self.last_ok, self.last_ok_at = True, time.monotonic()

    def draining(self) -> bool:
        """The last look succeeded, and one did within the stall bound."""
        return self.last_ok and time.monotonic() - self.last_ok_at <= self.stall_seconds


class Pump:
    """Drains the outbox into the events exchange (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        pool: postgres.Pool,
        publisher: PagePublisher,
        metrics: RelayMetrics,
        exits: NoExits = NO_EXITS,
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.publisher = publisher
        self.metrics = metrics
        self.exits = exits
        stall = 2 * settings.relay_poll_seconds + settings.publish_timeout_seconds + 5
        self.health = PumpHealth(stall)
        self.ledger = Ledger(
            metrics,
            exchange=publisher.exchange,
            routing_key=publisher.routing_key,
            lease_seconds=settings.relay_lease_seconds,
        )
        self._failures = 0  # batches failed in a row

    async def run(self, stop: asyncio.Event, wake: asyncio.Event) -> None:
        """Drain, then wait for ``wake`` or the poll, until ``stop``; after a failed batch,
        pause (only ``stop`` ends a pause early)."""
        while not stop.is_set():
            wake.clear()  # a NOTIFY from now on asks for another drain
            failed = await self.drain(stop)
            if stop.is_set():
                return
            if failed:
                await _first_of(stop, timeout=self._pause())
            else:
                await _first_of(stop, wake, timeout=self.settings.relay_poll_seconds)

    async def drain(self, stop: asyncio.Event) -> bool:
        """Relay batches while they come back full and ``stop`` is not set; whether one
        failed. A batch under way when ``stop`` is set is finished (published, marked)."""
        while True:
            try:
                batch = await self.relay_batch()
            except Exception as exc:
                self._failed_with(exc)
                return True
            if batch.failed:
                self._failures += 1
                self.health.last_ok = False
                return True
            self._failures = 0
            self.health.succeeded()
            if batch.claimed < self.settings.relay_batch_size or stop.is_set():
                return False

    async def relay_batch(self) -> Batch:
        """Claim one batch, publish it, mark what the broker confirmed, give back the rest."""
        started = time.monotonic()
        token = uuid.uuid4()
        async with self.pool.acquire() as conn:
            events = await claim_events(
                conn,
                self.settings.relay_batch_size,
                lease_seconds=self.settings.relay_lease_seconds,
                token=token,
            )
        batch = Batch(claimed=len(events))
        if not events:
            self.metrics.looked()
            return batch
        confirmed, refused = await self._publish(events, batch)
        confirmed_at = time.time()
        self.exits.after_publish()  # test-only: a crash between the publish and the mark
        async with self.pool.acquire() as conn:
            if confirmed:
                batch.marked = await mark_sent(
                    conn,
                    [event.id for event in confirmed],
                    token=token,
                    relay=self.settings.worker_id,
                )
            if refused:
                await release_claim(conn, [event.id for event in refused], token=token)
        if refused:  # said once they are given back: they stay pending
            self.ledger.refused(batch, retry_in=_pause_after(self._failures + 1))
        self.ledger.confirmed(batch, confirmed, seconds=time.monotonic() - started, at=confirmed_at)
        return batch

    async def _publish(
        self, events: Sequence[PendingEvent], batch: Batch
    ) -> tuple[list[PendingEvent], list[PendingEvent]]:
        """Publish the events as one page: the confirmed ones and the others (noted in
        ``batch``)."""
        page = [
            Command(
                event_body(event.reservation_id, event.hold_until, event.expired_at),
                event.message_id,
                event.traceparent,
            )
            for event in events
        ]
        outcomes = await self.publisher.publish(page, timeout=self.settings.publish_timeout_seconds)
        confirmed = [event for event, why in zip(events, outcomes, strict=True) if why is None]
        reasons = [why for why in outcomes if why is not None]
        batch.published = len(confirmed)
        batch.unroutable = sum(why.startswith(UNROUTABLE) for why in reasons)
        batch.unconfirmed = len(reasons) - batch.unroutable
        if reasons:
            batch.reason = reasons[0]
        refused = [event for event, why in zip(events, outcomes, strict=True) if why is not None]
        return confirmed, refused

    def _failed_with(self, exc: Exception) -> None:
        """A batch that raised: fatal when the schema or a privilege is missing (no retry
        would help), else logged, counted and tried again after a pause."""
        if schema_missing(exc) is not None or isinstance(exc, asyncpg.InsufficientPrivilegeError):
            raise exc
        self._failures += 1
        self.health.last_ok = False
        retry_in = _pause_after(self._failures)
        self.ledger.failed(classify(exc)[1], type(exc).__name__, retry_in=retry_in)

    def _pause(self) -> float:
        """The pause after the failures in a row so far."""
        return _pause_after(self._failures)


def _pause_after(failures: int) -> float:
    """The pause after ``failures`` failed batches in a row: 1 s, doubled each time, capped."""
    return min(PAUSE_MAX_SECONDS, PAUSE_FIRST_SECONDS * 2.0 ** max(0, failures - 1))


async def _first_of(*events: asyncio.Event, timeout: float) -> None:
    """Wait until one of ``events`` is set, or ``timeout`` seconds."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
