"""``python -m service.status``: one screen for the on-call (``service/ops/health.py``).

The first line is the verdict, then one line per problem found (what it means,
what to do), then the figures; ``--json`` carries the same as data. The exit
code is the most severe problem's, for a monitor: 0 all well; 1 PostgreSQL or
RabbitMQ cannot be reached; 3 the oldest due hold is older than
``EXPIRY_OLDEST_DUE_OBJECTIVE_SECONDS``; 4 degraded (no consumer, no scan pass
yet, the scanner stopped or failing); 5 not set up (the database not migrated,
the topology not declared). With one side down the other is still read.
"""

from __future__ import annotations

import argparse
import json

from service.adapters import amqp, postgres
from service.cli import run_command
from service.core.redaction import redact
from service.ops import health as ops
from service.ops import screen, survey
from service.settings import Settings

NAME = "expiry-status"


async def read_status(settings: Settings) -> ops.Status:
    """Read the database and the broker (through the first node of ``AMQP_URL`` that
    answers); either one unreachable is part of the status."""
    return await survey.read_status(
        settings,
        postgres.connected(settings, name=NAME),
        amqp.connected(settings, name=NAME),
    )


async def _main(settings: Settings, args: argparse.Namespace) -> int:
    status = await read_status(settings)
    shown = json.dumps(screen.as_json(status), indent=2) if args.json else screen.render(status)
    print(redact(shown))
    return status.exit_code


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m service.status",
        description=(
            "Say whether expiry is well: the verdict, each problem with what to do, the "
            "oldest due hold, the backlog, queues, scan passes and dead letters. Exit 0 all "
            "well; 1 PostgreSQL or RabbitMQ unreachable; 3 the oldest due hold older than "
            "EXPIRY_OLDEST_DUE_OBJECTIVE_SECONDS; 4 degraded (no consumer, no scan pass yet, "
            "the scanner stopped or failing); 5 not set up (not migrated, topology not "
            "declared). The most severe wins: 1 > 5 > 3 > 4."
        ),
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    run_command(parser, _main)


if __name__ == "__main__":
    main()
