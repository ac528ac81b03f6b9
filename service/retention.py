"""``python -m service.retention``: keep the service's tables bounded
(``service/ops/housekeeping.py``); run by the owner of the tables, like migrate, on a timer."""

from __future__ import annotations

import argparse
import asyncio
import contextlib

from service.adapters import postgres
from service.adapters.postgres.schema import require_current_schema
from service.cli import positive_seconds, report_failure, run_command, stop_on_signals
from service.core.errors import UsageError
from service.ops import housekeeping
from service.settings import Settings

PROG = "python -m service.retention"


async def _once(settings: Settings) -> None:
    async with postgres.connected(settings, name="expiry-retention") as conn:
        await require_current_schema(conn)
        report = await housekeeping.run(conn, settings)
    pruned = sum(report.pruned.values())
    print(
        f"retention done: {report.made} partition(s) made, {report.dropped} dropped "
        f"({report.dropped_rows} rows), {pruned} rows pruned; audit kept "
        f"{settings.retention_days} days",
        flush=True,
    )


async def _main(settings: Settings, args: argparse.Namespace) -> int:
    if args.every is None:
        await _once(settings)
        return 0
    failed = False
    with stop_on_signals(asyncio.Event()) as stop:
        while not stop.is_set():
            try:
                await _once(settings)
                failed = False
            except UsageError:  # run as a role that may not: no later run can do better
                raise
            except Exception as exc:  # the next run tries again; the alert watches
                failed = True
                report_failure(PROG, exc, verbose=args.verbose)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), args.every)
    return 1 if failed else 0


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Make the audit tables' weekly partitions ahead (EXPIRY_RETENTION_AHEAD_DAYS), "
            "drop those past EXPIRY_RETENTION_DAYS (each drop recorded in "
            "retention_actions), prune leases, settled dead letters, ended sessions and "
            "old working records; one line per action. Run as the owner of the tables. "
            "Safe to repeat, from two places at once, while consumers and scans run."
        ),
    )
    parser.add_argument(
        "--every",
        type=positive_seconds,
        metavar="SECONDS",
        help="run again every SECONDS until SIGTERM or SIGINT (e.g. 3600)",
    )
    run_command(parser, _main)


if __name__ == "__main__":
    main()
