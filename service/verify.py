"""``python -m service.verify``: prove from the database alone that each effect happened once.

Checks that every ``expired`` reservation has exactly one expiring transition
in the audit trail, that nothing left ``expired`` or ``consumed``, that nothing
was expired before its deadline, and that every due ``held`` reservation has a
live publish lease or became due within the scan interval. Prints the counts,
lists violations, and exits 1 on any.
"""

from __future__ import annotations

import argparse
import json

from service.adapters import postgres
from service.cli import run_command
from service.settings import Settings

EXIT_VIOLATIONS = 1


async def verify(
    settings: Settings, limit: int
) -> tuple[dict[str, int], dict[str, list[tuple[str, str]]]]:
    """Totals, and the violations of each check (each list at most ``limit`` long)."""
    conn = await postgres.connect(settings, application_name="expiry-verify")
    try:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            await postgres.prepare_verification(conn)
            totals = await postgres.verify_totals(conn)
            violations = {
                name: [
                    (str(rid), fact)
                    for rid, fact in await postgres.verify_check(
                        conn, name, limit=limit, scan_interval=settings.scan_interval_seconds
                    )
                ]
                for name in postgres.VERIFY_CHECKS
            }
    finally:
        await conn.close()
    return totals, violations


async def _main(settings: Settings, args: argparse.Namespace) -> int:
    totals, violations = await verify(settings, args.limit)
    failed = any(violations.values())
    if args.json:
        print(json.dumps({"ok": not failed, "totals": totals, "violations": violations}, indent=2))
        return EXIT_VIOLATIONS if failed else 0
    print("reservations: " + ", ".join(f"{k} {v}" for k, v in totals.items()))
    for name, found in violations.items():
        mark = (
            "ok"
            if not found
            else f"{len(found)}{'+' if len(found) >= args.limit else ''} VIOLATION(S)"
        )
        print(f"{name:42} {mark}")
        for reservation_id, fact in found:
            print(f"    {reservation_id}  {fact}")
    print("verify: FAILED" if failed else "verify: every effect happened exactly once")
    return EXIT_VIOLATIONS if failed else 0


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m service.verify",
        description="Check from the database alone that every expiry happened exactly once.",
    )
    parser.add_argument("--limit", type=int, default=20, help="violations listed per check")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    run_command(parser, _main)


if __name__ == "__main__":
    main()
