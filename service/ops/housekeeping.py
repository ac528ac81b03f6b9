"""One retention run: make the weeks ahead, drop the weeks past the retention (each drop
recorded), prune what is not audit; one line per action.

Idempotent and safe from two places at once (a run lock: the second waits, then finds
nothing left), and while consumers and scans run: a partition is made empty and then
attached, and detached concurrently before it is dropped, so that writers are never
blocked; the prunes go in batches. A run interrupted at any point is completed by the
next: a half-detached partition is finalized, a detached one dropped.
"""

from __future__ import annotations

import contextlib
import re
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from service.adapters import postgres
from service.adapters.postgres import locks
from service.adapters.postgres import partitions as store
from service.core import weeks as policy
from service.core.errors import ServiceError, UsageError
from service.core.weeks import AUDIT_TABLES, Partition
from service.ops.dead_letters import os_user
from service.settings import Settings

PRUNE_BATCH = 10_000
_WEEK_NAME = re.compile(r"^(?P<table>.+)_(?:w(?P<week>\d{8})|legacy)$")


@dataclass
class Report:
    """What a run did, as counts (its lines went to ``say``)."""

    made: int = 0
    dropped: int = 0
    dropped_rows: int = 0
    pruned: dict[str, int] = field(default_factory=dict)


async def run(
    conn: postgres.Connection,
    settings: Settings,
    *,
    now: datetime | None = None,
    say: Callable[[str], None] = print,
    batch: int = PRUNE_BATCH,
) -> Report:
    """One run as ``settings`` say, at ``now`` (default: the database's clock)."""
    report = Report()
    refused = await store.not_owner(conn)
    if refused is not None:
        raise UsageError(refused)
    who = store.Who(os_user(), socket.gethostname())
    async with _run_lock(settings):
        await store.relax_session(conn, pooled=settings.db_pooler == "transaction")
        try:
            at = now or await postgres.db_now(conn)
            await _finish_interrupted(conn, who, report, say)
            listed = await store.list_partitions(conn)
            await _make_ahead(conn, listed.partitions, at, settings, who, report, say)
            keep = timedelta(days=settings.retention_days)
            for partition in policy.to_drop(listed.partitions, at, keep):
                await store.detach(conn, partition)
                await _drop_partition(conn, partition, who, report, say)
            await _prune(conn, at, settings, who, report, say, batch)
            await store.record_run(conn, settings.worker_id, "ok")
        except Exception:
            await _record_failure(conn, settings.worker_id)
            raise
    return report


@contextlib.asynccontextmanager
async def _run_lock(settings: Settings) -> AsyncIterator[None]:
    """One run at a time (a second waits for the first to end)."""
    try:
        async with locks.holding(
            settings,
            store.RETENTION_LOCK_KEY,
            wait=store.RUN_WAIT_SECONDS,
            name="expiry-retention lock",
        ):
            yield
    except locks.LockBusy:
        raise ServiceError(
            f"another retention run held the run lock for over {store.RUN_WAIT_SECONDS:g}s"
        ) from None


async def _finish_interrupted(
    conn: postgres.Connection, who: store.Who, report: Report, say: Callable[[str], None]
) -> None:
    listed = await store.list_partitions(conn)
    for partition in listed.pending:
        await store.detach(conn, partition, finalize=True)
        await _drop_partition(conn, partition, who, report, say)
    for name in listed.detached:
        table, week = _named(name)
        await _drop(
            conn, table, name, (week, week + policy.WEEK) if week else None, who, report, say
        )


def _named(name: str) -> tuple[str, datetime | None]:
    """The table and week a partition's name says (None: the legacy one)."""
    found = _WEEK_NAME.match(name)
    if found is None or found["table"] not in AUDIT_TABLES:
        raise ValueError(f"not a partition name: {name}")
    week = found["week"]
    return found["table"], datetime.strptime(week, "%Y%m%d").replace(tzinfo=UTC) if week else None


async def _make_ahead(
    conn: postgres.Connection,
    partitions: list[Partition],
    at: datetime,
    settings: Settings,
    who: store.Who,
    report: Report,
    say: Callable[[str], None],
) -> None:
    ahead = timedelta(days=settings.retention_ahead_days)
    for table in AUDIT_TABLES:
        mine = [p for p in partitions if p.table == table]
        for low, high in policy.to_make(mine, at, ahead):
            async with postgres.transaction(conn):
                made = await store.make_partition(conn, table, low, high)
                if made is not None:
                    await store.record_action(conn, "made", table, low, high, 0, who)
            if made is not None:
                report.made += 1
                say(f"made {made} [{_day(low)}, {_day(high)})")


async def _drop_partition(
    conn: postgres.Connection,
    partition: Partition,
    who: store.Who,
    report: Report,
    say: Callable[[str], None],
) -> None:
    bounds = (partition.low, partition.high)
    await _drop(conn, partition.table, partition.name, bounds, who, report, say)


async def _drop(
    conn: postgres.Connection,
    table: str,
    name: str,
    bounds: tuple[datetime, datetime] | None,  # None: unknown (a detached legacy table)
    who: store.Who,
    report: Report,
    say: Callable[[str], None],
) -> None:
    low, high = bounds or (None, None)
    rows = await store.drop_detached(conn, table, name, low, high, who)
    report.dropped += 1
    report.dropped_rows += rows
    span = f"[{_day(low)}, {_day(high)})" if bounds else "(range unknown)"
    say(f"dropped {name} {span}: {rows} rows, recorded in retention_actions")


async def _prune(
    conn: postgres.Connection,
    at: datetime,
    settings: Settings,
    who: store.Who,
    report: Report,
    say: Callable[[str], None],
    batch: int,
) -> None:
    keep = at - timedelta(days=settings.retention_days)
    working = at - timedelta(days=settings.retention_working_days)
    hour = at - timedelta(hours=1)
    for table in store.PRUNES:
        cutoff = hour if table in store.HOUR_CUTOFF else working if table in store.WORKING else keep
        total = await store.prune(conn, table, cutoff, batch=batch)
        if total:
            await store.record_action(conn, "pruned", table, None, cutoff, total, who)
            report.pruned[table] = total
            say(f"pruned {table}: {total} rows (cutoff {_day(cutoff)})")


async def _record_failure(conn: postgres.Connection, runner: str) -> None:
    # The connection may be what failed: the run's own error is the news.
    with contextlib.suppress(Exception):
        await store.record_run(conn, runner, "failed")


def _day(moment: datetime | None) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M") if moment else "?"
