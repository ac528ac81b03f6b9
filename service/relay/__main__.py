"""``python -m service.relay``: publish the outbox's events until SIGTERM or SIGINT, then
finish the batch in hand and exit 0.

The process is ``service/relay/running.py``; what a batch does, ``pump.py``.
"""

from __future__ import annotations

import argparse
import asyncio

from service.adapters import telemetry
from service.adapters.telemetry.relay_metrics import RelayMetrics
from service.cli import run_command, stop_on_signals
from service.relay.running import run
from service.settings import Settings


async def _main(settings: Settings, _args: argparse.Namespace) -> int:
    with (
        stop_on_signals(asyncio.Event()) as stop,
        telemetry.telemetry_for(settings, "relay", metrics=True, long_lived=True),
    ):
        metrics = RelayMetrics(prometheus=telemetry.prometheus_registry(settings))
        try:
            await run(settings, stop, metrics=metrics)
        finally:
            metrics.close()
    return 0


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
