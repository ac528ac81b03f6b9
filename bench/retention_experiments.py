"""``bench.retention``'s two experiments, each in a migrated database of its own.

1. Bytes per thousand expiries: N expiries of the last hours, measured, then one
   retention run (``service.ops.housekeeping.run`` at the database's clock), measured again.
2. A year: a plan's expiries a week of rows at a time; with retention, a run at the end of
   each simulated week (``now=`` that Monday) followed by ``VACUUM publish_leases`` (what
   autovacuum does within a minute of the run's deletes); without, the inserts only.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import asyncpg

from bench.db import Connection
from bench.simulated_expiries import insert_expiries, make_weeks, record_scan_pass
from bench.table_sizes import Sizes, measure
from service.adapters import postgres
from service.core.weeks import WEEK, week_of
from service.ops import housekeeping
from service.settings import Settings

DAY = timedelta(days=1)
CHUNK = 50_000  # expiries per statement in part 1

# -- 1. bytes per thousand expiries -----------------------------------------------------


@dataclass
class PerThousand:
    expiries: int
    before: Sizes
    after: Sizes
    run: list[str]  # what the retention run said


async def per_thousand(settings: Settings, expiries: int) -> PerThousand:
    """``expiries`` expiries of three to four hours ago, measured before and after a
    retention run at the database's clock."""
    conn: Connection = await asyncpg.connect(settings.database_url)
    try:
        now: datetime = await conn.fetchval("SELECT now()")
        start = now - timedelta(hours=4)
        # The migration made this week's partition on; the rows may reach into the last.
        await make_weeks(conn, start - WEEK, week_of(start) + WEEK)
        spacing = 3600 / expiries  # all within one hour, the last 3 hours ago
        for first in range(0, expiries, CHUNK):
            count = min(CHUNK, expiries - first)
            at = start + timedelta(seconds=first * spacing)
            await insert_expiries(conn, at, spacing, count, settings.lease_seconds)
        await record_scan_pass(conn, now, expiries)
        before = await measure(conn)
        lines: list[str] = []
        keeper = await postgres.connect(settings, application_name="bench-retention")
        try:
            await housekeeping.run(keeper, settings, say=lines.append)
        finally:
            await keeper.close()
        after = await measure(conn)
    finally:
        await conn.close()
    return PerThousand(expiries, before, after, lines)


# -- 2. a year ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """The simulated year: ``days`` days to ``end`` (a Monday 00:00 UTC), ``per_day`` a
    day, in chunks that end on Mondays."""

    end: datetime
    days: int
    per_day: int

    @property
    def start(self) -> datetime:
        return self.end - self.days * DAY

    def chunks(self) -> list[tuple[datetime, datetime]]:
        bounds = [self.start]
        monday = week_of(self.start) + WEEK
        while monday < self.end:
            bounds.append(monday)
            monday += WEEK
        bounds.append(self.end)
        return list(itertools.pairwise(bounds))


@dataclass
class Year:
    sizes: Sizes
    insert_seconds: float = 0.0
    runs: int = 0
    run_seconds: list[float] = field(default_factory=list)
    made: int = 0
    dropped: int = 0
    dropped_rows: int = 0
    pruned: dict[str, int] = field(default_factory=dict)


async def simulate_year(
    settings: Settings, plan: Plan, *, retain: bool, say: Callable[[str], None]
) -> Year:
    """The plan's inserts, a chunk (a week) at a time; with ``retain``, a retention run at
    the end of each (``now=`` the chunk's end, a Monday) and a VACUUM of the leases."""
    label = "with retention" if retain else "without"
    conn: Connection = await asyncpg.connect(settings.database_url)
    # Retention's own connection, as the command opens it (its timeouts included).
    keeper = (
        await postgres.connect(settings, application_name="bench-retention") if retain else None
    )
    year = Year({})
    try:
        # The weekly partitions of every audit table from the plan's first week to its end.
        await make_weeks(conn, plan.start, plan.end)
        spacing = 86400 / plan.per_day
        chunks = plan.chunks()
        for number, (low, high) in enumerate(chunks, 1):
            began = time.perf_counter()
            await insert_expiries(
                conn, low, spacing, (high - low) // DAY * plan.per_day, settings.lease_seconds
            )
            await record_scan_pass(conn, high, (high - low) // DAY * plan.per_day)
            year.insert_seconds += time.perf_counter() - began
            if keeper is not None:
                await _retain(keeper, conn, settings, high, year)
            if number % 13 == 0 or number == len(chunks):
                say(f"  {label}: {number}/{len(chunks)} weeks, to {high:%Y-%m-%d}")
        year.sizes = await measure(conn)
    finally:
        if keeper is not None:
            await keeper.close()
        await conn.close()
    return year


async def _retain(
    keeper: postgres.PlainConnection,
    conn: Connection,
    settings: Settings,
    now: datetime,
    year: Year,
) -> None:
    began = time.perf_counter()
    report = await housekeeping.run(keeper, settings, now=now, say=lambda _line: None)
    year.run_seconds.append(time.perf_counter() - began)
    year.runs += 1
    year.made += report.made
    year.dropped += report.dropped
    year.dropped_rows += report.dropped_rows
    for table, rows in report.pruned.items():
        year.pruned[table] = year.pruned.get(table, 0) + rows
    await conn.execute("VACUUM publish_leases")
