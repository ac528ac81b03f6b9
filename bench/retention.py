"""``python -m bench.retention``: what the service's tables keep per expiry, and over a
simulated year, with and without retention (``python -m service.retention``), in databases
of its own (``bench_<random>_...``, migrated like a deploy, removed at the end).

An expiry is simulated as what the scan and a consumer write for it: the hold's row in
``reservations`` (the application's table, now 'expired'), its ``publish_leases`` row (the
lease long over) and its ``reservation_transitions`` row ('held' to 'expired', a worker
``host:1234``, message id ``expire:<uuid>:<ms>``, attempt 1), all three in one statement
per batch (``INSERT ... SELECT generate_series``); and the scanner's row of ``scan_passes``.
Sizes are ``pg_total_relation_size`` summed over ``pg_partition_tree`` (heap, TOAST, free
space and visibility maps, indexes, every partition) after ``VACUUM ANALYZE``.

1. Bytes per thousand expiries: N expiries (200,000) of the last hours, measured, then one
   retention run (``service.ops.housekeeping.run`` at the database's clock), measured again.
2. A year: ``--per-day`` expiries a day (10,000: 1/100 of a million) for 365 days ending on
   this week's Monday 00:00 UTC, a week of rows at a time (each row stamped in its own
   day), into two databases at once: in one retention runs at the end of each simulated
   week (``now=`` that Monday), followed by ``VACUUM publish_leases`` (what autovacuum does
   within a minute of the run's deletes, long before the next week); in the other it never
   runs (the same inserts only). The past weeks' partitions are made beforehand with
   ``expiry_make_partition`` as the owner, in both (the migration made this week's and
   four ahead). Both are measured at the end; the figures are scaled linearly to a million
   a day.

Prints the figures (``--json FILE``: writes them too); exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

from bench.config import endpoints_from
from bench.db import Connection
from bench.sandbox import new_name
from service.adapters import postgres
from service.adapters.postgres.databases import database_created
from service.adapters.postgres.partitions import TABLES
from service.adapters.postgres.schema import migrate
from service.cli import positive
from service.core.weeks import AUDIT_TABLES, WEEK, week_of
from service.ops import housekeeping
from service.settings import Settings

DAY = timedelta(days=1)
MILLION = 1_000_000
WORKER = "host:1234"  # a consumer's worker id: host name and process id
SCANNER = "host:1233"
CHUNK = 50_000  # expiries per statement in part 1
APPLICATION = "reservations"  # the application's table: the service never deletes from it
SERVICE_TABLES = tuple(name for name in TABLES if name != APPLICATION)
NAMED = ("reservation_transitions", "publish_leases", "scan_passes")
GROWING = ("reservation_transitions", "publish_leases")  # the service's, by the expiries

# `count` expiries from `start`, one every `spacing` seconds: the hold (due half a second
# before its expiry), its lease (published 0.3 s before, for the lease length) and its
# transition, in one statement (the foreign keys are checked at its end).
INSERT_EXPIRIES = """
WITH expiry AS MATERIALIZED (
    SELECT gen_random_uuid() AS id,
           $1::timestamptz + make_interval(secs => (g + 0.5) * $2::float8) AS at
      FROM generate_series(0, $3::int - 1) AS g
), command AS MATERIALIZED (
    SELECT id, at, at - interval '500 milliseconds' AS hold_until,
           at - interval '300 milliseconds' AS published,
           'expire:' || id::text || ':'
               || round(extract(epoch FROM at - interval '500 milliseconds') * 1000)::text
               AS message_id
      FROM expiry
), holds AS (
    INSERT INTO reservations (id, status, hold_until, created_at, updated_at)
    SELECT id, 'expired', hold_until, hold_until - interval '15 minutes', at FROM command
), leases AS (
    INSERT INTO publish_leases (reservation_id, message_id, lease_until, first_published,
                                last_published, publish_count)
    SELECT id, message_id, published + make_interval(secs => $5::int), published, published, 1
      FROM command
)
INSERT INTO reservation_transitions (reservation_id, from_status, to_status, at, message_id,
                                     attempt, worker)
SELECT id, 'held', 'expired', at, message_id, 1, $4 FROM command
"""

# The scanner's one row, as each of its passes leaves it.
SCAN_PASS = """
INSERT INTO scan_passes (scanner, started_at, finished_at, result, published, unconfirmed)
VALUES ($1, $2::timestamptz - interval '1 second', $2, 'ok', $3, 0)
    ON CONFLICT (scanner) DO UPDATE
   SET started_at = EXCLUDED.started_at, finished_at = EXCLUDED.finished_at,
       result = EXCLUDED.result, published = EXCLUDED.published, unconfirmed = 0
"""

MAKE_PARTITION = "SELECT expiry_make_partition($1, $2, $3)"

# Each table: its bytes on disk over its whole partition tree, and its leaf partitions (0:
# not partitioned). pg_partition_tree lists no row for a table that is not partitioned:
# the table itself is added.
SIZES = """
SELECT t.name,
       (SELECT sum(pg_total_relation_size(tree.relid))
          FROM (SELECT p.relid FROM pg_partition_tree(to_regclass(t.name)) AS p
                 UNION SELECT to_regclass(t.name)) AS tree)::bigint AS bytes,
       (SELECT count(*) FROM pg_partition_tree(to_regclass(t.name)) AS p
         WHERE p.isleaf)::int AS partitions
  FROM unnest($1::text[]) AS t (name)
"""


@dataclass(frozen=True)
class Size:
    """One table: its rows, its bytes on disk (all partitions and indexes), its partitions."""

    rows: int
    bytes: int
    partitions: int


Sizes = dict[str, Size]


def _total(sizes: Sizes, names: tuple[str, ...] = SERVICE_TABLES) -> int:
    return sum(sizes[name].bytes for name in names)


async def measure(conn: Connection) -> Sizes:
    """``VACUUM ANALYZE``, then every table's rows and size."""
    await conn.execute("VACUUM ANALYZE")
    names = [APPLICATION, *SERVICE_TABLES]
    found: Sizes = {}
    for row in await conn.fetch(SIZES, names):
        rows: int = await conn.fetchval(f'SELECT count(*) FROM "{row["name"]}"')
        found[row["name"]] = Size(rows, row["bytes"], row["partitions"])
    return found


async def insert_expiries(
    conn: Connection, start: datetime, spacing: float, count: int, lease_seconds: int
) -> None:
    await conn.execute(INSERT_EXPIRIES, start, spacing, count, WORKER, lease_seconds)


def settings_for(url: str) -> Settings:
    """The settings of database ``url``: the shipped retention settings (whatever the
    shell's EXPIRY_RETENTION_* say), the others as the environment has them."""
    fields = Settings.model_fields
    return Settings(
        database_url=url,
        retention_days=fields["retention_days"].default,
        retention_ahead_days=fields["retention_ahead_days"].default,
        retention_working_days=fields["retention_working_days"].default,
    )


async def migrated(url: str) -> Settings:
    """Migrate the database ``url`` as a deploy does; its settings."""
    settings = settings_for(url)
    await migrate(settings)
    return settings


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
        for table in AUDIT_TABLES:
            await conn.fetchval(MAKE_PARTITION, table, week_of(start) - WEEK, week_of(start))
            await conn.fetchval(MAKE_PARTITION, table, week_of(start), week_of(start) + WEEK)
        spacing = 3600 / expiries  # all within one hour, the last 3 hours ago
        for first in range(0, expiries, CHUNK):
            count = min(CHUNK, expiries - first)
            at = start + timedelta(seconds=first * spacing)
            await insert_expiries(conn, at, spacing, count, settings.lease_seconds)
        await conn.execute(SCAN_PASS, SCANNER, now, expiries)
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


def per_thousand_lines(found: PerThousand) -> list[str]:
    def per_k(count: float) -> str:
        return f"{count * 1000 / found.expiries:,.0f}"

    def row(label: str, before: tuple[str, str, float], after: tuple[str, str, float]) -> str:
        return (
            f"  {label:34} {before[0]:>9} {before[1]:>11} {_mb(before[2]):>10}   "
            f"{after[0]:>9} {after[1]:>11} {_mb(after[2]):>10}"
        )

    def one(name: str, note: str = "") -> str:
        b, a = found.before[name], found.after[name]
        return row(
            name,
            (f"{b.rows:,}", per_k(b.bytes), b.bytes),
            (f"{a.rows:,}", per_k(a.bytes), a.bytes),
        ) + (f"   {note}" if note else "")

    side = f"{'rows':>9} {'bytes/1000':>11} {'on disk':>10}"
    others = [n for n in SERVICE_TABLES if n not in NAMED]
    growing = [sum(sizes[n].bytes for n in GROWING) for sizes in (found.before, found.after)]
    totals = [_total(sizes) for sizes in (found.before, found.after)]
    rest = [sum(sizes[n].bytes for n in others) for sizes in (found.before, found.after)]
    return [
        f"1. bytes per 1,000 expiries: {found.expiries:,} expiries, before and after one "
        "retention run",
        f"  {'':34} {'before retention':^32}   {'after retention':^32}",
        f"  {'table':34} {side}   {side}",
        one("reservation_transitions"),
        one("publish_leases", "(after: the index's emptied pages, reused by new leases)"),
        row(
            "  the two, per expiry",
            ("", per_k(growing[0]), growing[0]),
            ("", per_k(growing[1]), growing[1]),
        ),
        one("scan_passes", "(one row per scanner: does not grow with the expiries)"),
        row(f"the other {len(others)} service tables", ("", "", rest[0]), ("", "", rest[1]))
        + "   (empty partitions; retention's records)",
        row(
            "the service tables, total",
            ("", per_k(totals[0]), totals[0]),
            ("", per_k(totals[1]), totals[1]),
        ),
        one(APPLICATION, "(the application's table, apart: never deleted by the service)"),
        "  the retention run: " + ("; ".join(found.run) or "nothing to do"),
    ]


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


async def make_past_weeks(conn: Connection, plan: Plan) -> None:
    """The weekly partitions of every audit table from the plan's first week to its end."""
    week = week_of(plan.start)
    while week < plan.end:
        for table in AUDIT_TABLES:
            await conn.fetchval(MAKE_PARTITION, table, week, week + WEEK)
        week += WEEK


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
        await make_past_weeks(conn, plan)
        spacing = 86400 / plan.per_day
        chunks = plan.chunks()
        for number, (low, high) in enumerate(chunks, 1):
            began = time.perf_counter()
            await insert_expiries(
                conn, low, spacing, (high - low) // DAY * plan.per_day, settings.lease_seconds
            )
            await conn.execute(SCAN_PASS, SCANNER, high, (high - low) // DAY * plan.per_day)
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


def scaled(sizes: Sizes, name: str, scale: float) -> float:
    """``name``'s bytes at ``scale`` times the rate: linear in the rows for the tables that
    grow with the expiries, as measured for the others (they do not)."""
    grows = name in GROWING or name == APPLICATION
    return sizes[name].bytes * scale if grows else float(sizes[name].bytes)


def scaled_total(sizes: Sizes, scale: float) -> float:
    return sum(scaled(sizes, name, scale) for name in SERVICE_TABLES)


def year_lines(plan: Plan, kept: Year, unkept: Year, retention_days: int) -> list[str]:
    scale = MILLION / plan.per_day
    share = f"1/{scale:,.0f} of a million" if scale >= 1 else f"{1 / scale:,.0f} million"
    side = f"{'rows':>11} {'on disk':>10} {'at 1M/day':>10}"
    lines = [
        f"2. a year at {plan.per_day:,} expiries a day ({share}): {plan.days} days, "
        f"{plan.start:%Y-%m-%d} to {plan.end:%Y-%m-%d} (a Monday), "
        f"{plan.days * plan.per_day:,} expiries",
        f"  {'':34} {'with retention (' + str(retention_days) + ' days)':^33}   "
        f"{'without (the inserts only)':^33}",
        f"  {'table':34} {side}   {side}",
    ]

    def row(
        label: str, rows: tuple[str, str], disk: tuple[float, float], at: tuple[str, str]
    ) -> str:
        return (
            f"  {label:34} {rows[0]:>11} {_mb(disk[0]):>10} {at[0]:>10}   "
            f"{rows[1]:>11} {_mb(disk[1]):>10} {at[1]:>10}"
        )

    def one(name: str) -> str:
        k, u = kept.sizes[name], unkept.sizes[name]
        line = row(
            name,
            (f"{k.rows:,}", f"{u.rows:,}"),
            (k.bytes, u.bytes),
            (_gb(scaled(kept.sizes, name, scale)), _gb(scaled(unkept.sizes, name, scale))),
        )
        return line + (f"   ({k.partitions} / {u.partitions} partitions)" if k.partitions else "")

    shown = [n for n in SERVICE_TABLES if n in NAMED or kept.sizes[n].rows or unkept.sizes[n].rows]
    rest = [n for n in SERVICE_TABLES if n not in shown]
    lines += [one(name) for name in shown]
    k_rest = sum(kept.sizes[n].bytes for n in rest)
    u_rest = sum(unkept.sizes[n].bytes for n in rest)
    lines.append(
        row(f"the other {len(rest)} (empty) service tables", ("", ""), (k_rest, u_rest), ("", ""))
    )
    k_total, u_total = _total(kept.sizes), _total(unkept.sizes)
    lines.append(
        row(
            "the service tables, total",
            ("", ""),
            (k_total, u_total),
            (_gb(scaled_total(kept.sizes, scale)), _gb(scaled_total(unkept.sizes, scale))),
        )
    )
    lines += [
        one(APPLICATION) + "   (the application's table, apart: never deleted by the service)",
        f"  at 1M/day: linear scaling, x{scale:,.0f}, of {', '.join(GROWING)} and "
        "reservations (their size is linear in their rows); the other tables, which do not "
        "grow with the rate, as measured",
        "  publish_leases with retention: the room of a week of leases (one run a week; "
        "emptied by each run, reused after the VACUUM)",
        f"  retention: {kept.runs} runs, one per simulated week; {kept.dropped} partitions "
        f"dropped ({kept.dropped_rows:,} rows), {kept.made} made; pruned "
        + (", ".join(f"{t} {n:,}" for t, n in sorted(kept.pruned.items())) or "nothing")
        + f"; a run took {_seconds(kept.run_seconds)}",
        f"  inserts: {kept.insert_seconds:.0f} s with retention, {unkept.insert_seconds:.0f} s"
        " without (both databases at once)",
    ]
    return lines


# -- the command ------------------------------------------------------------------------


def _mb(count: float) -> str:
    return f"{count / 1e6:,.1f} MB"


def _gb(count: float) -> str:
    return f"{count / 1e9:,.1f} GB"


def _seconds(samples: list[float]) -> str:
    if not samples:
        return "-"
    ordered = sorted(samples)
    return (
        f"median {ordered[len(ordered) // 2]:.2f} s, max {ordered[-1]:.2f} s, "
        f"{sum(ordered):.1f} s in all"
    )


def _sizes_json(sizes: Sizes) -> dict[str, Any]:
    return {name: asdict(size) for name, size in sizes.items()}


DESCRIPTION = (
    "Bytes per thousand expiries in the service's tables before and after a retention run, "
    "and a simulated year with and without retention, in databases of its own (removed at "
    "the end)."
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.retention", description=DESCRIPTION)
    add = p.add_argument
    add("--expiries", type=positive(int), default=200_000, help="part 1 (200,000)")
    add("--per-day", type=positive(int), default=10_000, help="part 2: a day (10,000)")
    add("--days", type=positive(int), default=365, help="part 2: days simulated (365)")
    add("--json", type=Path, metavar="FILE", help="write the figures as JSON to FILE")
    return p


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    began = time.perf_counter()
    endpoints = endpoints_from(os.environ)
    admin = endpoints.database_url
    base = settings_for(admin)
    name = new_name()
    print(
        f"python -m bench.retention: databases {name}_unit, {name}_kept, {name}_all; "
        f"retention {base.retention_days} days, partitions {base.retention_ahead_days} days "
        f"ahead, leases {base.lease_seconds} s; sizes after VACUUM ANALYZE, all partitions "
        "and indexes",
        flush=True,
    )
    async with database_created(admin, f"{name}_unit") as url:
        unit = await per_thousand(await migrated(url), args.expiries)
    for line in per_thousand_lines(unit):
        print(line, flush=True)
    async with (
        database_created(admin, f"{name}_kept") as kept_url,
        database_created(admin, f"{name}_all") as all_url,
    ):
        kept_settings = await migrated(kept_url)
        all_settings = await migrated(all_url)
        probe: Connection = await asyncpg.connect(kept_settings.database_url)
        try:
            now: datetime = await probe.fetchval("SELECT now()")
        finally:
            await probe.close()
        plan = Plan(week_of(now), args.days, args.per_day)

        def say(line: str) -> None:
            print(line, flush=True)

        kept, unkept = await asyncio.gather(
            simulate_year(kept_settings, plan, retain=True, say=say),
            simulate_year(all_settings, plan, retain=False, say=say),
        )
    for line in year_lines(plan, kept, unkept, base.retention_days):
        print(line, flush=True)
    elapsed = time.perf_counter() - began
    print(f"removed the databases; elapsed {elapsed:.0f} s", flush=True)
    scale = MILLION / plan.per_day
    return {
        "settings": {
            "retention_days": base.retention_days,
            "retention_ahead_days": base.retention_ahead_days,
            "lease_seconds": base.lease_seconds,
        },
        "per_thousand": {
            "expiries": unit.expiries,
            "before": _sizes_json(unit.before),
            "after": _sizes_json(unit.after),
            "service_bytes_per_1000_before": _total(unit.before) * 1000 / unit.expiries,
            "service_bytes_per_1000_after": _total(unit.after) * 1000 / unit.expiries,
            "retention_run": unit.run,
        },
        "year": {
            "start": plan.start.isoformat(),
            "end": plan.end.isoformat(),
            "days": plan.days,
            "per_day": plan.per_day,
            "with_retention": _sizes_json(kept.sizes),
            "without_retention": _sizes_json(unkept.sizes),
            "service_bytes_with_retention": _total(kept.sizes),
            "service_bytes_without_retention": _total(unkept.sizes),
            "scale_to_a_million_a_day": scale,
            "service_bytes_with_retention_scaled": scaled_total(kept.sizes, scale),
            "service_bytes_without_retention_scaled": scaled_total(unkept.sizes, scale),
            "scaling": "linear in the rows for reservation_transitions, publish_leases and "
            "reservations; the other tables as measured",
            "reservations_bytes_scaled": kept.sizes[APPLICATION].bytes * scale,
            "retention_runs": kept.runs,
            "retention_run_seconds": kept.run_seconds,
            "dropped_partitions": kept.dropped,
            "dropped_rows": kept.dropped_rows,
            "pruned": kept.pruned,
        },
        "elapsed_seconds": elapsed,
    }


def main() -> None:
    """Entry point."""
    args = parser().parse_args()
    figures = asyncio.run(main_async(args))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}", flush=True)


if __name__ == "__main__":
    main()
