"""``python -m service.deliver``: POST the events to the endpoints of ``EXPIRY_WEBHOOKS``
until SIGTERM or SIGINT, then settle the attempts in flight and exit 0.

The process is ``service/deliver/deliverer.py``; one endpoint's deliveries, ``courier.py``
and ``bookkeeping.py``.
"""

from __future__ import annotations

import argparse

from service import history
from service.adapters.telemetry.deliver_metrics import DeliverMetrics
from service.cli import run_command, serve_until_stopped
from service.deliver.deliverer import check_settings, enable, retire, run
from service.settings import Settings


async def _main(settings: Settings, args: argparse.Namespace) -> int:
    if args.retire is not None:
        return await retire(settings, args.retire, yes=args.yes, say=print)
    if args.enable is not None:
        return await enable(settings, args.enable, say=print)
    if args.backfill is not None:
        return await _backfill(settings, args)
    check_settings(settings)  # before telemetry starts: a refusal is one line
    return await serve_until_stopped(
        settings,
        "deliver",
        lambda registry: DeliverMetrics(prometheus=registry),
        lambda stop, metrics: run(settings, stop, metrics=metrics),
    )


async def _backfill(settings: Settings, args: argparse.Namespace) -> int:
    asked = history.asked(args.since, args.until, "--backfill")
    return await history.backfill(settings, args.backfill, asked, args.operator, say=print)


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m service.deliver",
        description=(
            "POST each reservation.expired event to every endpoint of EXPIRY_WEBHOOKS, signed "
            "(Standard Webhooks), until SIGTERM or SIGINT; then settle the attempts in flight "
            "and exit 0. Several may run at once."
        ),
    )
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument(
        "--enable",
        metavar="NAME",
        help="send to endpoint NAME again after it answered 410 Gone (which disables it): "
        "its waiting deliveries are due at once, the time it was disabled left out of "
        "their age",
    )
    chosen.add_argument(
        "--retire",
        metavar="NAME",
        help="stop delivering to endpoint NAME for good: no delivery is written for it any "
        "more and its deliveries, pending and dead, are deleted (its dead letters stay); "
        "shows what it would delete, and does it with --yes",
    )
    chosen.add_argument(
        "--backfill",
        metavar="NAME",
        help="queue for endpoint NAME every event written from --since (to --until) that the "
        "service still keeps; the running deliverers send them, each with its webhook-id "
        "(audited; --operator, one of EXPIRY_REPLAY_OPERATORS)",
    )
    parser.add_argument("--yes", action="store_true", help="with --retire: do it")
    history.add_window_arguments(parser, "--backfill")
    run_command(parser, _main)


if __name__ == "__main__":
    main()
