"""``python -m service.relay``: publish the outbox's events until SIGTERM or SIGINT, then
finish the batch in hand and exit 0.

The process is ``service/relay/running.py``; what a batch does, ``pump.py``.
"""

from __future__ import annotations

import argparse

from service.adapters.telemetry.relay_metrics import RelayMetrics
from service.cli import run_command, serve_until_stopped
from service.relay.running import check_settings, run
from service.settings import Settings


async def _main(settings: Settings, _args: argparse.Namespace) -> int:
    check_settings(settings)  # before telemetry starts: a refusal is one line
    return await serve_until_stopped(
        settings,
        "relay",
        lambda registry: RelayMetrics(prometheus=registry),
        lambda stop, metrics: run(settings, stop, metrics=metrics),
    )


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
    run_command(parser, _main)


if __name__ == "__main__":
    main()
