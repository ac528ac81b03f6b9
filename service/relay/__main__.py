"""``python -m service.relay``: publish the outbox's events until SIGTERM or SIGINT, then
finish the batch in hand and exit 0.

The process is ``service/relay/running.py``; what a batch does, ``pump.py``.
"""

from __future__ import annotations

import argparse

from service import history
from service.adapters.telemetry.relay_metrics import RelayMetrics
from service.cli import run_command, serve_until_stopped
from service.relay.running import check_settings, run
from service.settings import Settings


async def _main(settings: Settings, args: argparse.Namespace) -> int:
    if args.replay_to is not None:
        return await _replay_to(settings, args)
    check_settings(settings)  # before telemetry starts: a refusal is one line
    return await serve_until_stopped(
        settings,
        "relay",
        lambda registry: RelayMetrics(prometheus=registry),
        lambda stop, metrics: run(settings, stop, metrics=metrics),
    )


async def _replay_to(settings: Settings, args: argparse.Namespace) -> int:
    asked = history.asked(args.since, args.until, "--replay-to")
    return await history.replay_to(settings, args.replay_to, asked, args.operator, say=print)


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m service.relay",
        description=(
            "Publish the pending reservation.expired events to the exchange expiry.events, "
            "with publisher confirms, until SIGTERM or SIGINT; then finish the batch in hand "
            "and exit 0. Several may run at once."
        ),
    )
    parser.add_argument(
        "--replay-to",
        metavar="QUEUE",
        help="publish again, to QUEUE alone (the default exchange), every event written from "
        "--since (to --until) that the service still keeps, with its message id; then exit "
        "(an operator's act: the operator's database role and a broker user that may write "
        "to amq.default; audited, --operator one of EXPIRY_REPLAY_OPERATORS)",
    )
    history.add_window_arguments(parser, "--replay-to")
    run_command(parser, _main)


if __name__ == "__main__":
    main()
