"""``python -m service.consume``: run a consumer until SIGTERM or SIGINT, then drain.

The process itself (channels, the runtime, the health endpoint, the backlog
gauges) is ``service/worker/process.py``; what one delivery does is
``service/worker/consumer.py`` and the units it routes to.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging

from service.adapters import postgres, telemetry
from service.adapters.postgres.schema import require_current_schema
from service.adapters.telemetry.metrics import Metrics
from service.cli import run_command, stop_on_signals
from service.settings import Settings
from service.worker.process import BACKLOG_REFRESH_SECONDS, run

log = logging.getLogger("service.consume")


async def _main(settings: Settings, _args: argparse.Namespace) -> int:
    async with postgres.connected(settings, name="expiry-consume") as conn:
        await require_current_schema(conn)  # else every delivery would fail, then die
    with (
        stop_on_signals(asyncio.Event()) as stop,
        telemetry.telemetry_for(settings, "consume", metrics=True, long_lived=True) as installed,
    ):
        backlog_every = BACKLOG_REFRESH_SECONDS if installed.meters is not None else None
        metrics = Metrics(prometheus=telemetry.prometheus_registry(settings))
        # What start-up made (modules, classes, settings, telemetry) lives as long as the
        # process: out of the collector's way, a full collection no longer walks it each
        # time (docs/benchmark.md, "Start-up objects frozen"). Its garbage goes first.
        gc.collect()
        gc.freeze()
        try:
            await run(settings, stop, metrics=metrics, backlog_every=backlog_every)
        finally:
            metrics.close()
    log.info("consumer.stopped")
    return 0


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m service.consume",
        description=(
            "Consume expiration commands until SIGTERM or SIGINT, then finish what is in "
            "flight and exit 0."
        ),
    )
    run_command(parser, _main)


if __name__ == "__main__":
    main()
