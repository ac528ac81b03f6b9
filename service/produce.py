"""``python -m service.produce``: the scan (``service/scan/``) once, or on a timer.

SIGTERM or SIGINT stops a pass between pages: nothing more is claimed or
published, the confirms in flight are awaited and recorded as usual.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time

from service.adapters import telemetry
from service.cli import positive_seconds, run_command, stop_on_signals
from service.scan import ScanResult, ScanStopped, scan_once
from service.scan.every import Scanner, endpoint, report, scan_every
from service.settings import Settings

log = logging.getLogger("service.produce")

# After SIGTERM or SIGINT a pass only waits for the confirms in flight (at most
# the publish timeout), records them (a short transaction) and closes its
# connections (about 2 s for a broker that no longer answers). Past the publish
# timeout plus this margin it is cancelled and records nothing more: the claims
# of its pages in flight lapse on their own, at the latest CLAIM_MARGIN_SECONDS
# after the publish timeout, and a later scan publishes those holds again (a
# command confirmed but not yet recorded is then sent twice; the consumer finds
# its second delivery already done).
STOP_MARGIN_SECONDS = 5.0
ABANDONED = (
    "stopped by a signal, then cancelled after {:g}s before its last confirms were "
    "recorded; their claims lapse on their own and the next scan publishes the rest"
)


async def _scan_and_report(settings: Settings, *, stop: asyncio.Event) -> None:
    started = time.monotonic()
    result = await scan_once(settings, stop=stop)
    report(result, time.monotonic() - started)


async def _main(settings: Settings, args: argparse.Namespace) -> int:
    # --every serves /metrics (EXPIRY_HTTP_PORT); a one-shot --scan has nobody to serve.
    with telemetry.telemetry_for(settings, "produce", metrics=args.every is not None):
        await _run_until_stopped(settings, args.every)
    return 0


async def _run_until_stopped(settings: Settings, every: float | None) -> None:
    """One scan, or scans every ``every`` seconds, until done or stopped by a signal."""
    stop = asyncio.Event()
    bound = settings.publish_timeout_seconds + STOP_MARGIN_SECONDS
    deadline = asyncio.timeout(None)

    def give_them_bound_seconds() -> None:
        if deadline.when() is None:
            deadline.reschedule(asyncio.get_running_loop().time() + bound)

    try:
        async with deadline:
            with stop_on_signals(stop, also=give_them_bound_seconds):
                if every is None:
                    await _scan_and_report(settings, stop=stop)
                else:
                    scanner = Scanner.for_settings(settings, every)
                    async with endpoint(settings, scanner):
                        await scan_every(settings, every, stop, scanner)
    except TimeoutError:
        if not deadline.expired():
            raise
        if every is None:
            raise ScanStopped(ScanResult(stopped=True), ABANDONED.format(bound)) from None
        log.warning("scan.abandoned", extra={"after_seconds": bound})


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m service.produce",
        description=(
            "Publish an expiration command, with publisher confirms, for every due held "
            "reservation that has no live publish lease. Exit 0 only if all were confirmed."
        ),
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--scan", action="store_true", help="run one scan and exit")
    mode.add_argument(
        "--every",
        type=positive_seconds,
        metavar="SECONDS",
        help=(
            "start a scan every SECONDS (start to start) until SIGTERM or SIGINT; "
            "a failed scan is logged, then retried"
        ),
    )
    run_command(parser, _main)


if __name__ == "__main__":
    main()
