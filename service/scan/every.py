"""The scan on a timer (``produce --every``): a pass every N seconds, start to start, each
counted in the scanner's metrics and in its health.

The scanner is healthy while its passes succeed: the last pass that ended
succeeded, and a pass ended or recorded a page within the stall bound (two
intervals plus the publish timeout plus a margin), so a scan stuck on a dead
connection turns unhealthy too. Its endpoint (``EXPIRY_HTTP_PORT``) answers
``/healthz`` and ``/readyz`` with that, and serves ``/metrics``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from service.adapters.http.server import serving
from service.adapters.telemetry.gauges import configure
from service.adapters.telemetry.metrics import ScanMetrics
from service.core.errors import PublishNotConfirmed, TopologyMismatch
from service.scan.once import Links, ScanResult, ScanStopped, scan_once
from service.settings import Settings

log = logging.getLogger("service.produce")

STALL_MARGIN_SECONDS = 5.0
OK, FAILED, STOPPED = "ok", "failed", "stopped"


@dataclass
class ScanHealth:
    """Whether the passes succeed (see the module docstring)."""

    stall_seconds: float
    last_ok: bool = True  # until a pass ends, the scanner is starting: healthy
    last_end: float = field(default_factory=time.monotonic)
    current: ScanResult | None = None  # the pass under way

    def checks(self) -> dict[str, bool]:
        """The last pass that ended succeeded; a pass ended or progressed lately."""
        latest = self.last_end
        if self.current is not None:
            latest = max(latest, self.current.progressed_at)
        progressing = time.monotonic() - latest <= self.stall_seconds
        return {"last_pass_ok": self.last_ok, "progressing": progressing}

    def healthy(self) -> bool:
        """Every check holds."""
        return all(self.checks().values())


@dataclass
class Scanner:
    """The timer's state: its metrics and its health."""

    metrics: ScanMetrics
    health: ScanHealth

    @classmethod
    def for_settings(cls, settings: Settings, interval: float) -> Scanner:
        """A scanner whose metrics say the interval and the objective."""
        metrics = ScanMetrics(interval_seconds=interval)
        configure(metrics.gauges, settings)
        stall = 2 * interval + settings.publish_timeout_seconds + STALL_MARGIN_SECONDS
        return cls(metrics, ScanHealth(stall))

    def ended(self, result: ScanResult, outcome: str, seconds: float) -> None:
        """One pass ended: count it, and let the health follow."""
        self.metrics.passed(
            outcome,
            seconds=seconds,
            published=result.published,
            unconfirmed=result.failed,
            lapsed=result.lapsed,
        )
        if outcome == OK:
            self.metrics.last_success = time.time()
        if outcome != STOPPED:
            self.health.last_ok = outcome == OK
        self.health.last_end = time.monotonic()
        self.health.current = None


def report(result: ScanResult, elapsed: float) -> None:
    """The pass's one line on stdout (what a one-shot scan leaves for its caller)."""
    print(
        f"scan: published {result.published} command(s) in {result.batches} batch(es), "
        f"all confirmed, {elapsed:.2f}s",
        flush=True,
    )


async def scan_every(
    settings: Settings, interval: float, stop: asyncio.Event, scanner: Scanner | None = None
) -> None:
    """Start a scan every ``interval`` seconds (start to start) until ``stop``.

    A pass that takes longer than ``interval`` is followed by the next at once
    (no burst to catch up); a failed scan is logged, not fatal, except a topology
    that differs (``TopologyMismatch``), which stops it: the topology is checked
    until one pass got past the check, then no more; ``stop`` also stops the pass
    under way (see ``scan_once``). The connections are kept from one pass to the
    next while the passes succeed; a pass that fails closes them, and the next one
    connects afresh.
    """
    scanner = scanner or Scanner.for_settings(settings, interval)
    loop = asyncio.get_running_loop()
    next_start = loop.time()
    checked = False
    links = Links()  # kept from one pass to the next while the passes succeed
    try:
        while not stop.is_set():
            next_start += interval
            passed = await pass_on_timer(settings, stop, scanner, check=not checked, links=links)
            checked = passed or checked
            now = loop.time()
            if next_start < now:
                next_start = now
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(next_start - now):
                    await stop.wait()
    finally:
        await links.close()


async def pass_on_timer(
    settings: Settings,
    stop: asyncio.Event,
    scanner: Scanner,
    *,
    check: bool,
    links: Links | None = None,
) -> bool:
    """One pass of ``--every``: its failure, or its early stop, is logged and counted; a
    topology that differs is raised. Returns whether the pass got past the topology check."""
    result = scanner.health.current = ScanResult()
    started = time.monotonic()
    outcome, past_check = FAILED, False
    try:
        await scan_once(
            settings,
            stop=stop,
            check=check,
            result=result,
            gauges=scanner.metrics.gauges,
            links=links,
        )
        outcome, past_check = OK, True
        report(result, time.monotonic() - started)
    except TopologyMismatch:
        raise
    except ScanStopped as stopped:
        outcome = STOPPED
        facts = {"published": stopped.result.published, "failed": stopped.result.failed}
        log.info("scan.stopped", extra=facts)
    except PublishNotConfirmed:
        past_check = True
        log.exception("scan.failed")
    except Exception:
        log.exception("scan.failed")
    finally:
        scanner.ended(result, outcome, time.monotonic() - started)
    return past_check


@contextlib.asynccontextmanager
async def endpoint(settings: Settings, scanner: Scanner) -> AsyncIterator[None]:
    """The scanner's ``/healthz``, ``/readyz`` and ``/metrics`` on ``EXPIRY_HTTP_PORT``
    (none when it is 0)."""

    async def checks() -> dict[str, bool]:
        return scanner.health.checks()

    async with serving(
        settings.http_host, settings.http_port, checks, liveness=scanner.health.healthy
    ):
        yield
