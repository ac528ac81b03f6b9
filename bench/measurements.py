"""The measurements of the service: each one resets the database, runs real processes,
reads the figures.

Backlog method (the end-to-end rates): N due holds are placed and published by
the real scan first, with no consumer running; then K consumers start, and the
rate is the number expired over the time from the first to the last transition
(``reservation_transitions.at``, the database's clock).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from bench import cpu, db
from bench.amqp import Probe
from bench.config import Options
from bench.procs import Child, Usage, tree_usage
from bench.supervisor import Supervisor
from service.core.topology import QUEUE

SUSTAINED_LEAD_SECONDS = 1.0
SCAN_LINE = re.compile(r"scan: published (?P<n>\d+) command\(s\) .* (?P<seconds>[0-9.]+)s$", re.M)


@dataclass(frozen=True)
class ScanRun:
    """One ``produce --scan`` of a backlog."""

    published: int
    seconds: float  # as the scan reports it: connecting, paging, publishing, confirms
    usage: Usage  # the whole process, from wait4

    @property
    def rate(self) -> float:
        return self.published / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class ConsumeRun:
    """K consumer processes working off a backlog (or a steady arrival)."""

    consumers: int
    window: db.Window
    cpu_seconds: float  # all consumers, from attaching to the last expiry
    peak_rss_mb: float  # the largest consumer's VmHWM
    start_spread: float  # seconds between the consumers' first expiries
    machine: cpu.Shares  # the same interval: the machine, PostgreSQL, RabbitMQ

    @property
    def cpu_share(self) -> float:
        """CPU of one consumer process as a share of one core, from attaching to the end."""
        busy = self.machine.seconds * self.consumers
        return self.cpu_seconds / busy if busy > 0 else 0.0

    @property
    def cpu_us_per_expiry(self) -> float:
        return self.cpu_seconds / self.window.expired * 1e6 if self.window.expired else 0.0


@dataclass(frozen=True)
class LockedRun:
    """One consumer on a backlog while the support side holds some of its rows locked."""

    holds: int
    locked: int
    held_seconds: float  # how long the locks were held, from the consumer's start
    expired_at_release: int  # of the holds not locked
    free: db.Window  # the holds not locked: first to last expiry
    locked_done_seconds: float  # from the release until every locked hold had expired


@dataclass(frozen=True)
class SustainedRun:
    """Holds coming due at a steady rate, the scan on a timer, K consumers."""

    lag: db.Lag
    consume: ConsumeRun
    scan_passes: int  # passes that published something (all scanners)
    scan_published: int
    scan_rate: float  # publish rate while the consumers run: each scanner's, added up


def scan_passes(log: Path) -> list[tuple[int, float]]:
    """(published, seconds) of every pass of ``produce --every`` that published something."""
    text = log.read_text(errors="replace")
    found = ((int(m["n"]), float(m["seconds"])) for m in SCAN_LINE.finditer(text))
    return [(n, seconds) for n, seconds in found if n > 0]


def _rate(passes: list[tuple[int, float]]) -> float:
    """A scanner's publish rate over its passes (published / their seconds)."""
    seconds = sum(s for _, s in passes)
    return sum(n for n, _ in passes) / seconds if seconds > 0 else 0.0


def scan_seconds(log: Path, fallback: float) -> tuple[int, float]:
    """The published count and seconds from the scan's own report line."""
    found = SCAN_LINE.search(log.read_text(errors="replace"))
    if found is None:
        return 0, fallback
    return int(found["n"]), float(found["seconds"])


def total_cpu(before: Sequence[Usage], after: Sequence[Usage]) -> float:
    """CPU seconds spent between two samples of the same processes."""
    return sum(b.cpu_seconds - a.cpu_seconds for a, b in zip(before, after, strict=True))


@dataclass(frozen=True)
class Bench:
    """Runs the service's measurements in the sandbox (its database, its vhost), its
    processes started and stopped by the ``supervisor``."""

    options: Options
    conn: db.Connection
    probe: Probe
    supervisor: Supervisor
    servers: cpu.Servers
    database_url: str

    async def scan(self, holds: int, env: Mapping[str, str] | None = None) -> ScanRun:
        """Place ``holds`` due holds and run ``python -m service.produce --scan`` once."""
        await db.reset(self.conn)
        await db.insert_due(self.conn, holds)
        started = time.monotonic()
        child = await self.supervisor.run("scan", "service.produce", "--scan", env=env)
        published, seconds = scan_seconds(child.log, time.monotonic() - started)
        ready = await self.probe.ready(QUEUE)
        if published != holds or ready != holds:
            raise RuntimeError(f"the scan published {published} of {holds} ({ready} queued)")
        return ScanRun(published, seconds, child.usage())

    async def backlog(
        self,
        consumers: int,
        env: Mapping[str, str] | None = None,
        scan_env: Mapping[str, str] | None = None,
    ) -> tuple[ScanRun, ConsumeRun]:
        """The scan (with ``scan_env``) publishes N due holds, then K consumers (with
        ``env``) work them off."""
        scan = await self.scan(self.options.holds, scan_env)
        children = await self.supervisor.consumers(consumers, env or {})
        try:
            run = await self.work_off(children, self.options.holds)
        finally:
            await self.supervisor.stop(children)
        return scan, run

    async def traced(
        self, ratio: float, env: Mapping[str, str] | None = None
    ) -> tuple[ConsumeRun, int]:
        """The backlog drain of one consumer (with ``env``) that traces, exporting over
        OTLP/HTTP to a sink that discards what it is sent; the scan traces too and
        decides, ``ratio`` of its jobs sampled (parent-based, as compose ships it), and
        the consumer follows its decision. The spans the sink was sent (both's)."""
        async with self.supervisor.sink(f"otlp-sink-{ratio:g}") as sink:
            tracing = {
                "OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
                "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                "OTEL_TRACES_SAMPLER_ARG": f"{ratio:g}",
            }
            _, run = await self.backlog(1, {**tracing, **(env or {})}, tracing)
        return run, sink.spans()

    async def peer(self) -> ConsumeRun:
        """Dramatiq doing the same job (``bench/peer.py``): N due holds, one message
        each, enqueued first; then its default worker works them off."""
        holds = self.options.holds
        await db.reset(self.conn)
        await db.insert_due(self.conn, holds)
        await self.supervisor.run("peer-enqueue", "bench.peer", "enqueue")
        worker = self.supervisor.start("peer-dramatiq", "dramatiq", "bench.peer")
        try:
            # From its first expiry: its processes' start (imports) is not the job. One
            # worker id for all its processes: its start spread is 0.
            await self.supervisor.until_expired([worker], 1)
            return await self.work_off([worker], holds)
        finally:
            # Dramatiq's own exit code on SIGTERM is its own.
            await self.supervisor.stop([worker], check=False)

    async def locked_rows(self, share: float, held: float, env: Mapping[str, str]) -> LockedRun:
        """The scan publishes N due holds; another transaction row-locks ``share`` of them;
        one consumer starts; the locks are released (rolled back) ``held`` s later."""
        holds = self.options.holds
        await self.scan(holds)
        locker = await asyncpg.connect(self.database_url)
        try:
            tx = locker.transaction()
            await tx.start()
            locked = await db.lock_some(locker, max(1, round(holds * share)))
            children = await self.supervisor.consumers(1, env)
            await asyncio.sleep(held)
            at_release = await db.expired_count(self.conn)
            await tx.rollback()
        finally:
            await locker.close()
        released = time.monotonic()
        try:
            await self.supervisor.until_expired(children, holds)
            locked_done = time.monotonic() - released
        finally:
            await self.supervisor.stop(children)
        free = await db.expired_window_except(self.conn, locked)
        return LockedRun(holds, len(locked), held, at_release, free, locked_done)

    async def sustained(
        self, rate: int | None = None, duration: float | None = None, scanners: int = 1
    ) -> SustainedRun:
        """Holds due at ``rate``/s for ``duration`` s (default: the options'); ``scanners``
        scans every ``scan_every`` s, the largest number of consumers of the run."""
        options = self.options
        rate = rate or options.rate
        holds = max(1, round(rate * (duration or options.duration)))
        await db.reset(self.conn)
        children = await self.supervisor.consumers(options.sustained_consumers, {})
        scans = self.supervisor.scanners(scanners)
        try:
            for scanner in scans:
                await self.supervisor.first_scan(scanner, children)
            await db.insert_spread(self.conn, holds, lead=SUSTAINED_LEAD_SECONDS, rate=rate)
            run = await self.work_off(children, holds, also=scans)
        finally:
            await self.supervisor.stop([*scans, *children])
        passes = [scan_passes(scanner.log) for scanner in scans]
        return SustainedRun(
            await db.lag(self.conn),
            run,
            sum(len(p) for p in passes),
            sum(n for p in passes for n, _ in p),
            sum(_rate(p) for p in passes),  # scanners side by side: their rates add up
        )

    async def work_off(
        self, consumers: Sequence[Child], expected: int, also: Sequence[Child] = ()
    ) -> ConsumeRun:
        """Wait until ``expected`` holds expired; the consumers' CPU over that time (with
        their own children's: a traced consumer's span exporter, the peer's forked
        workers)."""
        before = [tree_usage(child.pid) for child in consumers]
        machine = cpu.snapshot(self.servers)
        await self.supervisor.until_expired([*consumers, *also], expected)
        after = [tree_usage(child.pid) for child in consumers]
        shares = cpu.shares(self.servers, machine, cpu.snapshot(self.servers))
        return ConsumeRun(
            len(consumers),
            await db.expired_window(self.conn),
            total_cpu(before, after),
            max(usage.peak_rss_mb for usage in after),
            await db.start_spread(self.conn),
            shares,
        )
