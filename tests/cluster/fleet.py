"""The service's real commands as subprocesses, their output in files, and what they logged.

Every process belongs to a ``Fleet``, which kills (by pid) whatever still
runs at the end, so that a failed test leaves no consumer behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any


def parse_events(text: str) -> list[dict[str, Any]]:
    """JSON objects, one per line; other lines (and a line cut short) are skipped."""
    events: list[dict[str, Any]] = []
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        with contextlib.suppress(json.JSONDecodeError):
            value = json.loads(line)
            if isinstance(value, dict):
                events.append(value)
    return events


def event_time(event: dict[str, Any]) -> datetime | None:
    """The ``ts`` of a JSON log line, if it has one."""
    stamp = event.get("ts")
    return datetime.fromisoformat(stamp) if isinstance(stamp, str) else None


@dataclass(eq=False)
class ServiceProcess:
    """One ``python -m service.*`` process and its log file."""

    name: str
    module: str
    log_path: Path
    process: asyncio.subprocess.Process

    @property
    def alive(self) -> bool:
        """Whether the process has not exited (as far as asyncio has noticed)."""
        return self.process.returncode is None

    def send(self, sig: int) -> None:
        """Send ``sig`` if the process still runs."""
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)

    async def wait(self, timeout: float = 60.0) -> int:
        """Wait for the exit code, at most ``timeout`` seconds."""
        async with asyncio.timeout(timeout):
            return await self.process.wait()

    async def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait; return the exit code."""
        self.send(signal.SIGTERM)
        return await self.wait(timeout)

    def text(self, start: int = 0) -> str:
        """What the process wrote, from byte ``start`` on."""
        if not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as log:
            log.seek(start)
            return log.read().decode(errors="replace")

    def size(self) -> int:
        """How many bytes the process has written so far."""
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def events(self, start: int = 0) -> list[dict[str, Any]]:
        """The JSON log lines written from byte ``start`` on."""
        return parse_events(self.text(start))

    def named(self, event: str, start: int = 0) -> list[dict[str, Any]]:
        """The JSON log lines of one event, from byte ``start`` on."""
        return [e for e in self.events(start) if e.get("event") == event]


@dataclass
class Fleet:
    """The processes of one test, started in ``workdir`` with their logs there."""

    workdir: Path
    processes: list[ServiceProcess] = field(default_factory=list)

    async def start(
        self, module: str, *args: str, name: str, env: dict[str, str]
    ) -> ServiceProcess:
        """Start ``python -m module args``."""
        log_path = self.workdir / f"{name}.log"
        with log_path.open("ab") as log:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                module,
                *args,
                env=env,
                cwd=self.workdir,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        started = ServiceProcess(name, module, log_path, process)
        self.processes.append(started)
        return started

    async def run(
        self, module: str, *args: str, name: str, env: dict[str, str], timeout: float = 120.0
    ) -> ServiceProcess:
        """Run a command to completion (at most ``timeout`` seconds)."""
        process = await self.start(module, *args, name=name, env=env)
        await process.wait(timeout)
        return process

    def of(self, module: str) -> list[ServiceProcess]:
        """The processes of one command."""
        return [p for p in self.processes if p.module == module]

    def outcomes(self) -> Counter[str]:
        """Every consumer's ``expiry.outcome`` lines, by outcome."""
        return Counter(
            str(event.get("outcome"))
            for process in self.of("service.consume")
            for event in process.named("expiry.outcome")
        )

    def reservations_with(self, outcome: str) -> set[str]:
        """The reservations for which some consumer logged this outcome."""
        return {
            str(event.get("reservation_id"))
            for process in self.of("service.consume")
            for event in process.named("expiry.outcome")
            if event.get("outcome") == outcome
        }

    def count(self, event: str) -> int:
        """How many lines of ``event`` the consumers logged."""
        return sum(len(process.named(event)) for process in self.of("service.consume"))

    async def reap(self) -> None:
        """SIGKILL whatever still runs, and wait for it."""
        for process in self.processes:
            process.send(signal.SIGKILL)
        for process in self.processes:
            with contextlib.suppress(TimeoutError):
                await process.wait(30)
