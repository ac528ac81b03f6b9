"""The measurements: each one resets the database, runs real processes, reads the figures.

Backlog method (the end-to-end rates): N due holds are placed and published by
the real scan first, with no consumer running; then K consumers start, and the
rate is the number expired over the time from the first to the last transition
(``reservation_transitions.at``, the database's clock). The raw consume + ack is
timed the same way: from its first delivery to its last ack.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from bench import cpu, db
from bench.amqp import Probe
from bench.config import Options
from bench.procs import Child, ChildFailed, Processes, Usage, tree_usage
from bench.raw import Measured
from service.core.topology import QUEUE

SCAN_TIMEOUT_SECONDS = 900.0
STALL_SECONDS = 60.0  # no expiry for this long: the run has failed
POLL_SECONDS = 0.1
BATCH_UPDATE_SIZE = 200
SUSTAINED_LEAD_SECONDS = 1.0
SCAN_LINE = re.compile(r"scan: published (?P<n>\d+) command\(s\) .* (?P<seconds>[0-9.]+)s$", re.M)
PER_MESSAGE_ENV = {"EXPIRY_BATCH_SIZE": "1"}


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
class RawRun:
    """The broker alone: publish with confirms, then consume + ack, in subprocesses."""

    publish: Measured
    consume: Measured
    consume_usage: Usage


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


def read_measured(path: Path) -> Measured:
    """A ``bench.raw`` result file."""
    data = json.loads(path.read_text())
    return Measured(int(data["count"]), float(data["seconds"]), float(data["cpu_seconds"]))


def total_cpu(before: Sequence[Usage], after: Sequence[Usage]) -> float:
    """CPU seconds spent between two samples of the same processes."""
    return sum(b.cpu_seconds - a.cpu_seconds for a, b in zip(before, after, strict=True))


@dataclass(eq=False)  # a runner, not a value: compared and hashed by identity
class Bench:
    """Runs the measurements in the sandbox (its database, its vhost, its processes)."""

    options: Options
    conn: db.Connection
    probe: Probe
    procs: Processes
    amqp_url: str
    servers: cpu.Servers
    say: Callable[[str], None]
    database_url: str
    _runs: int = field(default=0, init=False, repr=False)

    def _name(self, what: str) -> str:
        self._runs += 1
        return f"{self._runs:03d}-{what}"

    # -- the broker alone --------------------------------------------------------------

    async def raw(self) -> RawRun:
        """Publish N commands with confirms, then consume + ack them, with no database."""
        await self.probe.delete_raw()
        count = str(self.options.holds)
        publish = await self._raw("raw-publish", "publish", "--count", count, "--window", "500")
        consume = await self._raw(
            "raw-consume", "consume", "--count", count, "--prefetch", "1000", "--ack-every", "100"
        )
        await self.probe.delete_raw()
        return RawRun(read_measured(publish.log.with_suffix(".json")), *self._consumed(consume))

    def _consumed(self, child: Child) -> tuple[Measured, Usage]:
        return read_measured(child.log.with_suffix(".json")), child.usage()

    async def _raw(self, what: str, *args: str) -> Child:
        name = self._name(what)
        out = self.procs.logs / f"{name}.json"
        return await self.procs.run(
            name,
            "bench.raw",
            *args,
            "--url",
            self.amqp_url,
            "--out",
            str(out),
            timeout=SCAN_TIMEOUT_SECONDS,
        )

    # -- the database alone ------------------------------------------------------------

    async def batched_update(self) -> Measured:
        """The guarded update, 200 ids per statement, one connection, no broker."""
        await db.reset(self.conn)
        await db.insert_due(self.conn, self.options.holds)
        expired, seconds = await db.batch_expire(
            self.conn, batch_size=BATCH_UPDATE_SIZE, worker="bench-batched-update"
        )
        if expired != self.options.holds:
            raise RuntimeError(f"batched update expired {expired} of {self.options.holds}")
        return Measured(expired, seconds, 0.0)

    # -- the service -------------------------------------------------------------------

    async def scan(self, holds: int, env: Mapping[str, str] | None = None) -> ScanRun:
        """Place ``holds`` due holds and run ``python -m service.produce --scan`` once."""
        await db.reset(self.conn)
        await db.insert_due(self.conn, holds)
        started = time.monotonic()
        child = await self.procs.run(
            self._name("scan"), "service.produce", "--scan", env=env, timeout=SCAN_TIMEOUT_SECONDS
        )
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
        children = await self._consumers(consumers, env or {})
        try:
            run = await self._work_off(children, self.options.holds)
        finally:
            await self._stop(children)
        return scan, run

    async def traced(
        self, ratio: float, env: Mapping[str, str] | None = None
    ) -> tuple[ConsumeRun, int]:
        """The backlog drain of one consumer (with ``env``) that traces, exporting over
        OTLP/HTTP to a sink that discards what it is sent; the scan traces too and
        decides, ``ratio`` of its jobs sampled (parent-based, as compose ships it), and
        the consumer follows its decision. The spans the sink was sent (both's)."""
        name = self._name(f"otlp-sink-{ratio:g}")
        port_file, out = self.procs.logs / f"{name}.port", self.procs.logs / f"{name}.json"
        sink = self.procs.start(
            name, "bench.sink", "--port-file", str(port_file), "--out", str(out)
        )
        try:
            async with asyncio.timeout(30):
                while not port_file.exists() or not port_file.read_text():
                    self.procs.check_alive([sink])
                    await asyncio.sleep(POLL_SECONDS / 2)
            tracing = {
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port_file.read_text()}",
                "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                "OTEL_TRACES_SAMPLER_ARG": f"{ratio:g}",
            }
            _, run = await self.backlog(1, {**tracing, **(env or {})}, tracing)
        finally:
            await self._stop([sink])
        sent = json.loads(out.read_text())
        if sent["invalid"]:
            raise RuntimeError(f"the OTLP sink got {sent['invalid']} bodies that are not OTLP")
        return run, int(sent["spans"])

    async def peer(self) -> ConsumeRun:
        """Dramatiq doing the same job (``bench/peer.py``): N due holds, one message
        each, enqueued first; then its default worker works them off."""
        holds = self.options.holds
        await db.reset(self.conn)
        await db.insert_due(self.conn, holds)
        await self.procs.run(
            self._name("peer-enqueue"), "bench.peer", "enqueue", timeout=SCAN_TIMEOUT_SECONDS
        )
        worker = self.procs.start(self._name("peer-dramatiq"), "dramatiq", "bench.peer")
        try:
            # From its first expiry: its processes' start (imports) is not the job.
            await self._until_expired([worker], 1)
            before, machine = tree_usage(worker.pid), cpu.snapshot(self.servers)
            await self._until_expired([worker], holds)
            after = tree_usage(worker.pid)
            shares = cpu.shares(self.servers, machine, cpu.snapshot(self.servers))
        finally:
            await self.procs.stop([worker])  # Dramatiq's own exit code on SIGTERM is its own
        return ConsumeRun(
            1,
            await db.expired_window(self.conn),
            after.cpu_seconds - before.cpu_seconds,
            after.peak_rss_mb,
            0.0,
            shares,
        )

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
            children = await self._consumers(1, env)
            await asyncio.sleep(held)
            at_release = await db.expired_count(self.conn)
            await tx.rollback()
        finally:
            await locker.close()
        released = time.monotonic()
        try:
            await self._until_expired(children, holds)
            locked_done = time.monotonic() - released
        finally:
            await self._stop(children)
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
        children = await self._consumers(options.sustained_consumers, {})
        scans = [
            self.procs.start(
                self._name(f"scan-every-{i}"),
                "service.produce",
                "--every",
                f"{options.scan_every:g}",
                env={"EXPIRY_WORKER_ID": f"bench-scanner-{i}"},
            )
            for i in range(1, scanners + 1)
        ]
        try:
            for scanner in scans:
                await self._first_scan(scanner, children)
            await db.insert_spread(self.conn, holds, lead=SUSTAINED_LEAD_SECONDS, rate=rate)
            run = await self._work_off(children, holds, also=scans)
        finally:
            await self._stop([*scans, *children])
        passes = [scan_passes(scanner.log) for scanner in scans]
        return SustainedRun(
            await db.lag(self.conn),
            run,
            sum(len(p) for p in passes),
            sum(n for p in passes for n, _ in p),
            sum(_rate(p) for p in passes),  # scanners side by side: their rates add up
        )

    async def _consumers(self, count: int, env: Mapping[str, str]) -> list[Child]:
        children = [
            self.procs.start(
                self._name(f"consumer-{i}"),
                "service.consume",
                env={**env, "EXPIRY_WORKER_ID": f"bench-consumer-{i}"},
            )
            for i in range(1, count + 1)
        ]
        async with asyncio.timeout(SCAN_TIMEOUT_SECONDS):
            while await self.probe.consumers(QUEUE) < count:
                self.procs.check_alive(children)
                await asyncio.sleep(POLL_SECONDS / 2)
        return children

    async def _first_scan(self, scanner: Child, children: Sequence[Child]) -> None:
        async with asyncio.timeout(SCAN_TIMEOUT_SECONDS):
            while "scan: published" not in scanner.log.read_text(errors="replace"):
                self.procs.check_alive([scanner, *children])
                await asyncio.sleep(POLL_SECONDS)

    async def _work_off(
        self, consumers: Sequence[Child], expected: int, also: Sequence[Child] = ()
    ) -> ConsumeRun:
        """Wait until ``expected`` holds expired; the consumers' CPU over that time (with
        their own children's: a traced consumer's span exporter)."""
        before = [tree_usage(child.pid) for child in consumers]
        machine = cpu.snapshot(self.servers)
        await self._until_expired([*consumers, *also], expected)
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

    async def _until_expired(self, children: Sequence[Child], expected: int) -> None:
        done, progress_at = 0, time.monotonic()
        while done < expected:
            self.procs.check_alive(children)
            now = await db.expired_count(self.conn)
            if now > done:
                done, progress_at = now, time.monotonic()
            elif time.monotonic() - progress_at > STALL_SECONDS + self.options.duration:
                raise ChildFailed(f"stalled: {done} of {expected} expired")
            await asyncio.sleep(POLL_SECONDS)

    async def _stop(self, children: Sequence[Child]) -> None:
        codes = await self.procs.stop(children)
        failed = {name: code for name, code in codes.items() if code != 0}
        if failed:
            raise ChildFailed(f"exit codes after SIGTERM: {failed}")
