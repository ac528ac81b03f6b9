"""The service's commands as subprocesses: started, sampled from ``/proc``, stopped.

Children are reaped with ``os.wait4`` so that each one's own CPU time and peak
RSS are known after it exits; while it runs, ``/proc/<pid>/stat`` and
``/proc/<pid>/status`` tell the same.
"""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bench.config import REPO

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
STOP_TIMEOUT_SECONDS = 60.0
POLL_SECONDS = 0.05


def child_env(
    environ: Mapping[str, str],
    *,
    database_url: str,
    amqp_url: str,
    management_url: str,
    overrides: Iterable[tuple[str, str]] = (),
) -> dict[str, str]:
    """The children's environment: the service's defaults against the benchmark's sandbox.

    No ``EXPIRY_*`` or ``OTEL_*`` variable of the caller's shell leaks in (only the
    ``overrides`` asked for on the command line), the log level the service ships with
    (``INFO``), as users run it. ``management_url`` is where the scan and the consumers
    read the topology's arguments to check them.
    """
    env = {k: v for k, v in environ.items() if not k.startswith(("EXPIRY_", "OTEL_"))}
    env.update(
        DATABASE_URL=database_url,
        AMQP_URL=amqp_url,
        EXPIRY_MANAGEMENT_URL=management_url,
        EXPIRY_LOG_FORMAT="json",
        EXPIRY_HTTP_PORT="0",
        PYTHONUNBUFFERED="1",
    )
    env.update(overrides)
    return env


class ChildFailed(RuntimeError):
    """A child exited with an error, or did not exit in time."""


@dataclass(frozen=True)
class Usage:
    """CPU time (user + system) and peak resident memory of one process."""

    cpu_seconds: float
    peak_rss_mb: float


def usage_from_proc(pid: int) -> Usage:
    """What ``/proc`` says about a running process (utime + stime, VmHWM)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime: fields 14, 15
    peak_kb = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            peak_kb = int(line.split()[1])
    return Usage(cpu, peak_kb / 1024)


def tree_usage(pid: int) -> Usage:
    """CPU of a running process and of every process below it (``/proc``); the largest
    peak RSS among them (a worker that forks its workers, as Dramatiq's does)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(text[text.rindex(")") + 2 :].split()[1])
    tree, grown = {pid}, True
    while grown:
        below = {child for child, parent in parents.items() if parent in tree} - tree
        tree |= below
        grown = bool(below)
    total, peak = 0.0, 0.0
    for member in tree:
        try:
            usage = usage_from_proc(member)
        except (OSError, ValueError, IndexError):
            continue  # it has just exited
        total += usage.cpu_seconds
        peak = max(peak, usage.peak_rss_mb)
    return Usage(total, peak)


def usage_from_rusage(usage: resource.struct_rusage) -> Usage:
    """The same from ``wait4`` (``ru_maxrss`` is in KiB on Linux)."""
    return Usage(usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024)


@dataclass
class Child:
    """One ``python -m ...`` process, its output going to a log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    started: float = field(default_factory=time.monotonic)
    exit_code: int | None = None
    final_usage: Usage | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        """Reap the child if it exited (keeping its rusage); its exit code, or ``None``."""
        if self.exit_code is None:
            pid, status, usage = os.wait4(self.pid, os.WNOHANG)
            if pid != 0:
                self.exit_code = os.waitstatus_to_exitcode(status)
                self.popen.returncode = self.exit_code
                self.final_usage = usage_from_rusage(usage)
        return self.exit_code

    async def wait(self, timeout: float) -> int:
        """Wait for the child to exit; ``TimeoutError`` past ``timeout`` seconds."""
        async with asyncio.timeout(timeout):
            while True:
                code = self.poll()
                if code is not None:
                    return code
                await asyncio.sleep(POLL_SECONDS)

    def usage(self) -> Usage:
        """CPU and peak RSS so far (from ``/proc`` while it runs, ``wait4`` after)."""
        if self.poll() is None:
            try:
                return usage_from_proc(self.pid)
            except (OSError, ValueError, IndexError):
                self.poll()
        if self.final_usage is None:
            raise ChildFailed(f"{self.name}: no usage (pid {self.pid})")
        return self.final_usage

    def signal(self, signum: int) -> None:
        """Send ``signum`` unless the child has already exited."""
        if self.poll() is None:
            self.popen.send_signal(signum)

    def tail(self, lines: int = 3) -> str:
        """The last lines the child wrote."""
        text = self.log.read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:]) or "(no output)"


class Processes:
    """Starts the commands with a controlled environment, and stops every one of them."""

    def __init__(self, env: Mapping[str, str], logs: Path) -> None:
        self.env = dict(env)
        self.logs = logs
        self.children: list[Child] = []

    def start(
        self, name: str, module: str, *args: str, env: Mapping[str, str] | None = None
    ) -> Child:
        """Start ``python -m module args`` from the repository root."""
        log = self.logs / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", module, *args],
                cwd=REPO,
                env={**self.env, **(env or {})},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches the benchmark, which stops them
            )
        child = Child(name, popen, log)
        self.children.append(child)
        return child

    async def run(
        self,
        name: str,
        module: str,
        *args: str,
        timeout: float,
        env: Mapping[str, str] | None = None,
    ) -> Child:
        """Run a command to completion; raise ``ChildFailed`` unless it exits 0."""
        child = self.start(name, module, *args, env=env)
        try:
            code = await child.wait(timeout)
        except TimeoutError:
            await self.stop([child])
            raise ChildFailed(f"{name} did not finish within {timeout:g}s") from None
        if code != 0:
            raise ChildFailed(f"{name} exited {code}: {child.tail()}")
        return child

    def check_alive(self, children: Iterable[Child]) -> None:
        """Raise ``ChildFailed`` if any of ``children`` has exited."""
        for child in children:
            if child.poll() is not None:
                raise ChildFailed(f"{child.name} exited {child.exit_code}: {child.tail()}")

    async def stop(self, children: Iterable[Child]) -> dict[str, int]:
        """SIGTERM, then wait (SIGKILL past the timeout); each one's exit code."""
        children = list(children)
        for child in children:
            child.signal(signal.SIGTERM)
        codes: dict[str, int] = {}
        for child in children:
            try:
                codes[child.name] = await child.wait(STOP_TIMEOUT_SECONDS)
            except TimeoutError:
                child.signal(signal.SIGKILL)
                codes[child.name] = await child.wait(STOP_TIMEOUT_SECONDS)
        return codes

    async def stop_all(self) -> None:
        """Stop every child still running (at the end, also after a failure or Ctrl-C)."""
        await self.stop(child for child in self.children if child.poll() is None)
