"""``python -m service.produce``: the scan (``service/scan.py``) once, or on a timer.

SIGTERM or SIGINT stops a pass between pages: nothing more is claimed or
published, the confirms in flight are awaited and recorded as usual.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time

from service.adapters import lifecycle
from service.cli import positive_seconds, run_command
from service.core.errors import PublishNotConfirmed, TopologyMismatch
from service.scan import ScanResult, ScanStopped, scan_once
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


async def _scan_and_report(
    settings: Settings, *, stop: asyncio.Event | None = None, check: bool = True
) -> None:
    started = time.monotonic()
    result = await scan_once(settings, stop=stop, check=check)
    elapsed = time.monotonic() - started
    print(
        f"scan: published {result.published} command(s) in {result.batches} batch(es), "
        f"all confirmed, {elapsed:.2f}s",
        flush=True,
    )


async def scan_every(settings: Settings, interval: float, stop: asyncio.Event) -> None:
    """Start a scan every ``interval`` seconds (start to start) until ``stop``.

    A pass that takes longer than ``interval`` is followed by the next at once
    (no burst to catch up); a failed scan is logged, not fatal, except a topology
    that differs (``TopologyMismatch``), which stops it: the topology is checked
    until one pass got past the check, then no more; ``stop`` also stops the pass
    under way (see ``scan``).
    """
    loop = asyncio.get_running_loop()
    next_start = loop.time()
    checked = False
    while not stop.is_set():
        next_start += interval
        checked = await _pass_on_timer(settings, stop, check=not checked) or checked
        now = loop.time()
        if next_start < now:
            next_start = now
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(next_start - now):
                await stop.wait()


async def _pass_on_timer(settings: Settings, stop: asyncio.Event, *, check: bool) -> bool:
    """One pass of ``--every``: its failure, or its early stop, is logged; a topology that
    differs is raised. Returns whether the pass got past the topology check."""
    try:
        await _scan_and_report(settings, stop=stop, check=check)
    except TopologyMismatch:
        raise
    except ScanStopped as stopped:
        facts = {"published": stopped.result.published, "failed": stopped.result.failed}
        log.info("scan.stopped", extra=facts)
        return False
    except PublishNotConfirmed:
        log.exception("scan.failed")
        return True
    except Exception:
        log.exception("scan.failed")
        return False
    return True


async def _main(settings: Settings, args: argparse.Namespace) -> int:
    with lifecycle.telemetry_for(settings, "produce"):
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
            with lifecycle.stop_on_signals(stop, also=give_them_bound_seconds):
                if every is None:
                    await _scan_and_report(settings, stop=stop)
                else:
                    await scan_every(settings, every, stop)
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
