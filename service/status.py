"""``python -m service.status``: one screen for the on-call (``service/ops/status.py``).

Exits 3 when the oldest due hold is older than
``EXPIRY_OLDEST_DUE_OBJECTIVE_SECONDS``, so that it serves as an alert or a
health check; 1 when the database or the broker cannot be reached (the broker
through the first node of ``AMQP_URL`` that answers).
"""

from __future__ import annotations

import argparse
import json

from service.adapters import lifecycle
from service.cli import run_command
from service.core.redaction import redact
from service.ops import status as ops
from service.settings import Settings

NAME = "expiry-status"


async def read_status(settings: Settings) -> ops.Status:
    """Read the database (required) and the broker (reported if unreachable)."""
    async with lifecycle.database(settings, name=NAME) as conn:
        status = await ops.read_database(conn, settings)
    try:
        async with lifecycle.broker(settings, name=NAME) as connection:
            status.queues = await ops.read_queues(connection, settings.retry_delays)
    except ops.BROKER_ERRORS as exc:
        status.broker_error = ops.describe(exc)
    return status


async def _main(settings: Settings, args: argparse.Namespace) -> int:
    status = await read_status(settings)
    print(redact(json.dumps(ops.as_json(status), indent=2) if args.json else ops.render(status)))
    return status.exit_code


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m service.status",
        description=(
            "Show the oldest due hold, the backlog, queues and dead letters. Exit 3 when the "
            "oldest due hold is older than EXPIRY_OLDEST_DUE_OBJECTIVE_SECONDS, 1 on failure."
        ),
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    run_command(parser, _main)


if __name__ == "__main__":
    main()
