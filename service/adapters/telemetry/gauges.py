"""The gauges a process reads from the database: the backlog, its clock's drift, what
retention keeps (each table's size, the audit's range, the last run), and (where
its role may read them) open dead letters, how many nobody owns and the oldest one's age,
and the outbox's backlog (pending events, the oldest one's age: every consumer exports it,
so that its alert fires when no relay runs); once, or on a timer."""

from __future__ import annotations

import asyncio
import logging

from service.adapters import postgres
from service.adapters.classify import classify
from service.adapters.postgres import partitions
from service.adapters.postgres.outbox import pending as outbox_pending
from service.adapters.telemetry.readings import Gauges
from service.settings import Settings

log = logging.getLogger("service.metrics")


def configure(gauges: Gauges, settings: Settings) -> None:
    """The settings the alert rules compare with, as gauges."""
    gauges.objective_seconds = settings.oldest_due_objective_seconds
    gauges.drift_tolerance_seconds = settings.clock_drift_tolerance_seconds
    gauges.dead_letter_age_objective_seconds = settings.dead_letter_age_objective_seconds
    gauges.events_objective_seconds = settings.events_objective_seconds


async def read_gauges(
    conn: postgres.Connection, gauges: Gauges, *, dead_letters: bool, outbox: bool = False
) -> None:
    """Read them now (``dead_letters``: the role may read ``dead_letters``; ``outbox``: the
    outbox's backlog, ``expiry_events``)."""
    gauges.backlog = await postgres.backlog(conn)
    gauges.clock_drift_seconds = await postgres.clock_drift(conn)
    if dead_letters:
        gauges.open_dead_letters = dict(await postgres.dead_letters_by_class(conn))
        unowned, oldest = await postgres.unowned_and_oldest_open(conn)
        gauges.unowned_dead_letters = unowned
        gauges.oldest_open_dead_letter_age_seconds = oldest
    await _read_retention(conn, gauges)  # a database not yet at 0013 spares the others
    if outbox:  # last: a database not yet at 0014
        pending = await outbox_pending(conn)
        gauges.events_pending = pending.count
        gauges.oldest_pending_event_age_seconds = pending.oldest_age_seconds


async def refresh_gauges(
    pool: postgres.Pool, gauges: Gauges, every: float, *, dead_letters: bool, outbox: bool = False
) -> None:
    """Keep them current (observable gauges cannot await the database); a failed read is
    logged and the old values stay until the next one."""
    while True:
        try:
            async with pool.acquire() as conn:
                await read_gauges(conn, gauges, dead_letters=dead_letters, outbox=outbox)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("metrics.refresh_failed", extra={"error_class": classify(exc)[1]})
        await asyncio.sleep(every)


async def _read_retention(conn: postgres.Connection, gauges: Gauges) -> None:
    retained = await partitions.retained(conn)
    gauges.table_bytes = {t.name: float(t.bytes) for t in retained.tables}
    gauges.retained_since = {t.name: t.since.timestamp() for t in retained.tables if t.since}
    gauges.partitions_ahead_seconds = retained.partitions_ahead_seconds
    last = retained.last_ok
    gauges.retention_last_success = last.timestamp() if last is not None else 0.0
