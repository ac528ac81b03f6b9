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

The expiries are written by ``bench.simulated_expiries``, the sizes read by
``bench.table_sizes``, the two parts run by ``bench.retention_experiments`` and printed
by ``bench.retention_report``. Prints the figures (``--json FILE``: writes them too);
exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg

from bench.config import endpoints_from
from bench.db import Connection
from bench.retention_experiments import Plan, per_thousand, simulate_year
from bench.retention_report import figures, per_thousand_lines, year_lines
from bench.sandbox import new_name
from service.adapters.postgres.databases import database_created
from service.adapters.postgres.schema import migrate
from service.cli import positive
from service.core.weeks import week_of
from service.settings import Settings


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
    return figures(base, unit, plan, kept, unkept, elapsed)


def main() -> None:
    """Entry point."""
    args = parser().parse_args()
    figures = asyncio.run(main_async(args))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}", flush=True)


if __name__ == "__main__":
    main()
