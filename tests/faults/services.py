"""The service's real commands as subprocesses, with their output in files, and the
environment they run with (shared with the cluster test, ``tests/cluster/fleet.py``).

Every process of a scenario belongs to its ``Fleet``, which reaps whatever
is still alive at the end (by pid, SIGKILL), so no test leaves a consumer
behind. JSON log lines are read back from the files for the figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from asyncio.subprocess import DEVNULL
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import start_module

RETRY_DELAYS = (1, 2, 4)
# One delay queue per tier (no jitter): the scenarios count the retries per tier and the
# messages in the delay queues (their names follow these: World.retry_queues).
RETRY_JITTER, RETRY_JITTER_SLOTS = 0.0, 2

# Short budgets so that retries happen within seconds; everything else (the publish
# lease too) is the service's default.
SERVICE_ENV = {
    "EXPIRY_RETRY_DELAYS": ",".join(str(d) for d in RETRY_DELAYS),
    "EXPIRY_RETRY_JITTER": str(RETRY_JITTER),
    "EXPIRY_RETRY_JITTER_SLOTS": str(RETRY_JITTER_SLOTS),
    "EXPIRY_MAX_ATTEMPTS": "10",
    "EXPIRY_MAX_AGE_SECONDS": "300",
    "EXPIRY_LOCK_TIMEOUT_MS": "1000",
    "EXPIRY_STATEMENT_TIMEOUT_MS": "5000",
    "EXPIRY_DB_CONNECT_TIMEOUT_SECONDS": "2",
    "EXPIRY_PUBLISH_TIMEOUT_SECONDS": "5",
    "EXPIRY_HEARTBEAT_SECONDS": "5",
    "EXPIRY_SHUTDOWN_TIMEOUT_SECONDS": "20",
    "EXPIRY_LOG_FORMAT": "json",
    "EXPIRY_LOG_LEVEL": "DEBUG",  # one expiry.outcome line per delivery, which they count
}


def service_env(
    database_url: str, amqp_url: str, management_url: str, **overrides: str
) -> dict[str, str]:
    """The environment of one service process: nothing of the shell's ``EXPIRY_*`` or
    servers leaks in; the short budgets, the given servers; ``overrides`` win."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("EXPIRY_") and key not in ("DATABASE_URL", "AMQP_URL")
    }
    env.update(SERVICE_ENV)
    env.update(
        DATABASE_URL=database_url,
        AMQP_URL=amqp_url,
        EXPIRY_MANAGEMENT_URL=management_url,
        PYTHONUNBUFFERED="1",
    )
    env.update(overrides)
    return env


@dataclass(eq=False)
class ServiceProcess:
    """One ``python -m service.*`` process and its log file."""

    name: str
    module: str
    log_path: Path
    process: asyncio.subprocess.Process
    started_at: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        """The process id."""
        return self.process.pid

    @property
    def alive(self) -> bool:
        """Whether the process has not exited (as far as asyncio has noticed)."""
        return self.process.returncode is None

    @property
    def returncode(self) -> int | None:
        """The exit code (negative: killed by that signal), or None while running."""
        return self.process.returncode

    def send(self, sig: int) -> None:
        """Send ``sig`` if the process still runs."""
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)

    async def wait(self, timeout: float = 60.0) -> int:
        """Wait for the exit code, at most ``timeout`` seconds."""
        async with asyncio.timeout(timeout):
            return await self.process.wait()

    async def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Signal and wait; return the exit code."""
        self.send(sig)
        return await self.wait(timeout)

    def text(self, start: int = 0) -> str:
        """What the process wrote so far, from byte ``start`` on."""
        if not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as log:
            log.seek(start)
            return log.read().decode(errors="replace")

    def size(self) -> int:
        """How many bytes the process has written so far."""
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def events(self, start: int = 0) -> list[dict[str, Any]]:
        """The JSON log lines from byte ``start`` on (a line cut short by a SIGKILL is skipped)."""
        return parse_events(self.text(start))

    def named(self, event: str, start: int = 0) -> list[dict[str, Any]]:
        """The JSON log lines of one event, from byte ``start`` on."""
        return [e for e in self.events(start) if e.get("event") == event]

    def plain_lines(self) -> list[str]:
        """The lines that are not JSON log lines (what a human reads on stderr)."""
        return [
            line for line in self.text().splitlines() if line.strip() and not line.startswith("{")
        ]


def parse_events(text: str) -> list[dict[str, Any]]:
    """JSON objects, one per line; other lines are ignored."""
    events: list[dict[str, Any]] = []
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        with contextlib.suppress(json.JSONDecodeError):
            value = json.loads(line)
            if isinstance(value, dict):
                events.append(value)
    return events


@dataclass
class Fleet:
    """The processes of one scenario."""

    workdir: Path
    processes: list[ServiceProcess] = field(default_factory=list)
    _counter: Counter[str] = field(default_factory=Counter)

    async def start(
        self, module: str, *args: str, name: str, env: dict[str, str]
    ) -> ServiceProcess:
        """Start ``python -m module args`` in the scenario's directory."""
        self._counter[name] += 1
        suffix = "" if self._counter[name] == 1 else f"-{self._counter[name]}"
        log_path = self.workdir / f"{name}{suffix}.log"
        with log_path.open("ab") as log:
            process = await start_module(
                module, *args, env=env, output=log, cwd=self.workdir, stdin=DEVNULL
            )
        started = ServiceProcess(name + suffix, module, log_path, process)
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

    def consumer_stats(self) -> LogStats:
        """What every consumer of the scenario logged."""
        events: list[dict[str, Any]] = []
        for process in self.of("service.consume"):
            events.extend(process.events())
        return LogStats(events)

    async def reap(self) -> None:
        """SIGKILL whatever still runs, and wait for it."""
        for process in self.processes:
            process.send(signal.SIGKILL)
        for process in self.processes:
            with contextlib.suppress(TimeoutError):
                await process.wait(30)


@dataclass
class LogStats:
    """Counts over consumers' JSON log lines."""

    events: list[dict[str, Any]]

    def named(self, event: str) -> list[dict[str, Any]]:
        """The lines of one event."""
        return [e for e in self.events if e.get("event") == event]

    @property
    def outcomes(self) -> Counter[str]:
        """``expiry.outcome`` lines by outcome."""
        return Counter(str(e.get("outcome")) for e in self.named("expiry.outcome"))

    @property
    def deliveries(self) -> int:
        """Deliveries the consumers finished handling (an outcome, a retry, a dead letter,
        or a copy the broker refused)."""
        return sum(
            len(self.named(name))
            for name in (
                "expiry.outcome",
                "expiry.retry",
                "expiry.dead_letter",
                "expiry.copy_failed",
            )
        )

    @property
    def duplicates(self) -> int:
        """Deliveries that found their hold already expired."""
        return self.outcomes["already-done"]

    @property
    def redelivered(self) -> int:
        """Outcomes of deliveries that the broker flagged as redelivered."""
        return sum(1 for e in self.named("expiry.outcome") if e.get("redelivered"))

    @property
    def retries(self) -> int:
        """Commands sent to a delay queue."""
        return len(self.named("expiry.retry"))

    def for_reservation(self, reservation_id: str) -> list[dict[str, Any]]:
        """Every line about one reservation, in file order per process."""
        return [e for e in self.events if e.get("reservation_id") == reservation_id]
