"""The benchmark's children by role: each started, waited for until it is ready, watched
while the work is done, and stopped with its exit code checked.

Consumers are ready once they are attached to the work queue, a scanner on a timer once
it has reported its first pass, a relay once it listens and has started, a deliverer
once it has registered its endpoints and started, the OTLP sink
once it has written the port it listens on; the work is done once the expected holds
have expired (no progress for a minute past the sustained run's duration fails the run).
``bench.procs`` starts and stops the processes themselves; this module knows what each
role is waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench import db
from bench.amqp import Probe
from bench.config import Options
from bench.procs import Child, ChildFailed, Processes
from service.core.topology import QUEUE

SCAN_TIMEOUT_SECONDS = 900.0
STALL_SECONDS = 60.0  # no expiry for this long: the run has failed
POLL_SECONDS = 0.1
SINK_READY_SECONDS = 30.0
# A relay is ready once it listens for the consumers' wake-ups and has started its drain.
RELAY_READY = ("relay.listening", "relay.started")
# A deliverer is ready once it has registered its endpoints and started its couriers.
DELIVERER_READY = "deliver.started"


@dataclass(frozen=True)
class Sink:
    """A listening ``bench.sink``: where to export to, and the file it writes at its end."""

    endpoint: str
    out: Path

    def spans(self) -> int:
        """The spans it was sent (once it has stopped); a body that is not OTLP fails."""
        sent = json.loads(self.out.read_text())
        if sent["invalid"]:
            raise RuntimeError(f"the OTLP sink got {sent['invalid']} bodies that are not OTLP")
        return int(sent["spans"])


@dataclass(eq=False)  # a runner, not a value: compared and hashed by identity
class Supervisor:
    """Starts, waits for and stops the children of one benchmark run (named in the order
    they start: ``001-raw-publish``, ``002-raw-consume``, ...)."""

    procs: Processes
    probe: Probe
    conn: db.Connection
    options: Options
    _runs: int = field(default=0, init=False, repr=False)

    def name(self, what: str) -> str:
        """The next child's name (its log file's too)."""
        self._runs += 1
        return f"{self._runs:03d}-{what}"

    def start(
        self, what: str, module: str, *args: str, env: Mapping[str, str] | None = None
    ) -> Child:
        """Start ``python -m module args``; do not wait for it."""
        return self.procs.start(self.name(what), module, *args, env=env)

    async def run(
        self, what: str, module: str, *args: str, env: Mapping[str, str] | None = None
    ) -> Child:
        """Run ``python -m module args`` to its exit 0."""
        return await self.procs.run(
            self.name(what), module, *args, env=env, timeout=SCAN_TIMEOUT_SECONDS
        )

    async def consumers(self, count: int, env: Mapping[str, str]) -> list[Child]:
        """``count`` consumers (``service.consume`` with ``env``), once all are attached."""
        children = [
            self.start(
                f"consumer-{i}",
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

    def scanners(self, count: int) -> list[Child]:
        """``count`` scanners (``service.produce --every``, the run's scan interval), started."""
        return [
            self.start(
                f"scan-every-{i}",
                "service.produce",
                "--every",
                f"{self.options.scan_every:g}",
                env={"EXPIRY_WORKER_ID": f"bench-scanner-{i}"},
            )
            for i in range(1, count + 1)
        ]

    async def first_scan(self, scanner: Child, children: Sequence[Child]) -> None:
        """Until ``scanner`` has reported its first pass (``children`` still alive)."""
        async with asyncio.timeout(SCAN_TIMEOUT_SECONDS):
            while "scan: published" not in scanner.log.read_text(errors="replace"):
                self.procs.check_alive([scanner, *children])
                await asyncio.sleep(POLL_SECONDS)

    async def relay(self, env: Mapping[str, str] | None = None) -> Child:
        """``python -m service.relay`` (with ``env``), once it listens and has started."""
        child = self.start(
            "relay", "service.relay", env={**(env or {}), "EXPIRY_WORKER_ID": "bench-relay"}
        )
        async with asyncio.timeout(SCAN_TIMEOUT_SECONDS):
            while not all(m in child.log.read_text(errors="replace") for m in RELAY_READY):
                self.procs.check_alive([child])
                await asyncio.sleep(POLL_SECONDS / 2)
        return child

    async def deliverers(self, count: int, env: Mapping[str, str]) -> list[Child]:
        """``count`` deliverers (``python -m service.deliver`` with ``env``), once each
        has registered its endpoints and started."""
        children = [
            self.start(
                f"deliverer-{i}",
                "service.deliver",
                env={**env, "EXPIRY_WORKER_ID": f"bench-deliverer-{i}"},
            )
            for i in range(1, count + 1)
        ]
        async with asyncio.timeout(SCAN_TIMEOUT_SECONDS):
            while not all(DELIVERER_READY in c.log.read_text(errors="replace") for c in children):
                self.procs.check_alive(children)
                await asyncio.sleep(POLL_SECONDS / 2)
        return children

    @contextlib.asynccontextmanager
    async def sink(self, what: str) -> AsyncIterator[Sink]:
        """A ``bench.sink`` listening for OTLP/HTTP, stopped (exit 0) at the end."""
        name = self.name(what)
        port_file, out = self.procs.logs / f"{name}.port", self.procs.logs / f"{name}.json"
        child = self.procs.start(
            name, "bench.sink", "--port-file", str(port_file), "--out", str(out)
        )
        try:
            async with asyncio.timeout(SINK_READY_SECONDS):
                while not port_file.exists() or not port_file.read_text():
                    self.procs.check_alive([child])
                    await asyncio.sleep(POLL_SECONDS / 2)
            yield Sink(f"http://127.0.0.1:{port_file.read_text()}", out)
        finally:
            await self.stop([child])

    async def until_expired(self, children: Sequence[Child], expected: int) -> None:
        """Until ``expected`` holds have expired; ``ChildFailed`` if one of ``children``
        exits or the expiries stall."""
        done, progress_at = 0, time.monotonic()
        while done < expected:
            self.procs.check_alive(children)
            now = await db.expired_count(self.conn)
            if now > done:
                done, progress_at = now, time.monotonic()
            elif time.monotonic() - progress_at > STALL_SECONDS + self.options.duration:
                raise ChildFailed(f"stalled: {done} of {expected} expired")
            await asyncio.sleep(POLL_SECONDS)

    async def stop(self, children: Sequence[Child], *, check: bool = True) -> None:
        """SIGTERM them and wait; with ``check``, ``ChildFailed`` unless each exits 0."""
        codes = await self.procs.stop(children)
        failed = {name: code for name, code in codes.items() if code != 0}
        if check and failed:
            raise ChildFailed(f"exit codes after SIGTERM: {failed}")
