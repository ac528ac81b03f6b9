"""``python -m service.deliver``: POST the events to the endpoints of ``EXPIRY_WEBHOOKS``
until SIGTERM or SIGINT, then settle the attempts in flight and exit 0.

The process is ``service/deliver/running.py``; one endpoint's deliveries, ``courier.py``.
"""

from __future__ import annotations

import argparse
import asyncio

from service.adapters import telemetry
from service.adapters.telemetry.deliver_metrics import DeliverMetrics
from service.cli import run_command, stop_on_signals
from service.deliver.deliverer import check_settings, run
from service.settings import Settings


async def _main(settings: Settings, _args: argparse.Namespace) -> int:
    check_settings(settings)  # before telemetry starts: a refusal is one line
    with (
        stop_on_signals(asyncio.Event()) as stop,
        telemetry.telemetry_for(settings, "deliver", metrics=True, long_lived=True),
    ):
        metrics = DeliverMetrics(prometheus=telemetry.prometheus_registry(settings))
        try:
            await run(settings, stop, metrics=metrics)
        finally:
            metrics.close()
    return 0


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
    run_command(parser, _main)


if __name__ == "__main__":
    main()
