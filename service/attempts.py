"""``python -m service.attempts EVENT``: what happened to an event, endpoint by endpoint:
each webhook attempt (when, which, what made it, the status or the error's class, how
long, by which deliverer) and where each delivery stands (delivered, pending, dead).

EVENT is the event's message id (the ``webhook-id`` a receiver got) or its hold's
reservation id. Run as the operator (``expiry_operator``). Exits 0 when the event is
found; 1 when no event of that name is kept (never written, or older than retention).
"""

from __future__ import annotations

import argparse
import json

from service.adapters import postgres
from service.adapters.postgres.schema import require_current_schema
from service.cli import run_command
from service.ops import event_history
from service.settings import Settings

EXIT_FOUND = 0
EXIT_NOT_KEPT = 1


async def _main(settings: Settings, args: argparse.Namespace) -> int:
    async with postgres.connected(settings, name="expiry-attempts") as conn:
        await require_current_schema(conn)
        stories = await event_history.read(conn, args.event)
    if args.json:
        print(json.dumps([story.as_json() for story in stories], indent=2))
    elif not stories:
        print(
            f"no event {args.event!r} is kept: not an expired hold's message id or reservation "
            "id, or older than what retention keeps"
        )
    else:
        print("\n".join(line for story in stories for line in story.lines()))
    return EXIT_FOUND if stories else EXIT_NOT_KEPT


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m service.attempts",
        description=(
            "What happened to an event, endpoint by endpoint: every webhook attempt and where "
            "each delivery stands. Exit 0 found; 1 no such event is kept."
        ),
    )
    parser.add_argument(
        "event", help="the event's message id (its webhook-id), or its reservation id"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    run_command(parser, _main)


if __name__ == "__main__":
    main()
