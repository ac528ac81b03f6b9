"""``python -m service.verify``: prove from the database alone that each effect happened once.

The checks are ``service/ops/verification.py``'s. Prints the counts, lists
violations, and exits 1 on any.
"""

from __future__ import annotations

import argparse
import json

from service.adapters import lifecycle
from service.cli import run_command
from service.ops.verification import verify
from service.settings import Settings

EXIT_VIOLATIONS = 1


async def _main(settings: Settings, args: argparse.Namespace) -> int:
    async with lifecycle.database(settings, name="expiry-verify") as conn:
        verdict = await verify(conn, limit=args.limit, scan_interval=settings.scan_interval_seconds)
    if args.json:
        print(json.dumps(verdict.as_json(), indent=2))
    else:
        print("\n".join(verdict.lines()))
    return EXIT_VIOLATIONS if verdict.failed else 0


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
