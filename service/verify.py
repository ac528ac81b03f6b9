"""``python -m service.verify``: prove from the database alone that each effect happened once
(and that each expiry since the outbox exists has exactly one event, none pending too long).

The checks are ``service/ops/verification.py``'s. The first line is the
verdict; then the counts and each check with its violations. Exits 0 when
proven; 1 on any violation; 4 with no violation but due holds that no scan
pass has covered yet (how many, since when, the last pass); 5 when the
database is not migrated (or by an older release).
"""

from __future__ import annotations

import argparse
import json

from service.adapters import postgres
from service.adapters.postgres.schema import schema_state
from service.cli import run_command
from service.ops.conditions import MIGRATE_COMMAND
from service.ops.verification import EXIT_NOT_MIGRATED, pending_bound, verify
from service.settings import Settings


async def _main(settings: Settings, args: argparse.Namespace) -> int:
    async with postgres.connected(settings, name="expiry-verify") as conn:
        schema = await schema_state(conn)
        if not schema.current:
            return _not_migrated(schema.describe(), list(schema.missing), args)
        verdict = await verify(
            conn,
            limit=args.limit,
            scan_interval=settings.scan_interval_seconds,
            pending_bound=pending_bound(
                lease_seconds=settings.relay_lease_seconds,
                objective_seconds=settings.events_objective_seconds,
            ),
        )
    if args.json:
        print(json.dumps(verdict.as_json(), indent=2))
    else:
        print("\n".join(verdict.lines()))
    return verdict.exit_code


def _not_migrated(what: str, missing: list[str], args: argparse.Namespace) -> int:
    line = f"verify: the database is not migrated ({what}): run {MIGRATE_COMMAND}"
    if args.json:
        data = {"ok": False, "proven": False, "state": "not-migrated", "verdict": line}
        print(json.dumps({**data, "missing_migrations": missing}, indent=2))
    else:
        print(line)
    return EXIT_NOT_MIGRATED


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m service.verify",
        description=(
            "Check from the database alone that every expiry happened exactly once and has "
            "exactly one event (none pending for over an hour). Exit 0 "
            "proven; 1 a violation; 4 no violation, but due holds await a scan; 5 the "
            "database is not migrated."
        ),
    )
    parser.add_argument("--limit", type=int, default=20, help="violations listed per check")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    run_command(parser, _main)


if __name__ == "__main__":
    main()
