"""The service's real commands against the sandbox, as subprocesses with their output in files."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from service.demo.workspace import Sandbox
from service.settings import process_environment

STOP_TIMEOUT_SECONDS = 60.0


@dataclass
class Child:
    """One ``python -m service.*`` process, its output going to a file."""

    name: str
    process: asyncio.subprocess.Process
    log: Path


class Children:
    """Starts the service's commands against the sandbox, and stops them with SIGTERM."""

    def __init__(self, sandbox: Sandbox, management_url: str | None, logs: Path) -> None:
        self.sandbox = sandbox
        self.management_url = management_url  # None: beside AMQP_URL, as the service finds it
        self.logs = logs
        self.running: list[Child] = []  # the long-running ones: consumers and the scan

    def env(self, **extra: str) -> dict[str, str]:
        """This process's environment, pointed at the sandbox."""
        env = {k: v for k, v in process_environment().items() if k != "EXPIRY_FAILPOINT"}
        env.update(
            DATABASE_URL=self.sandbox.database_url,
            AMQP_URL=",".join(self.sandbox.amqp_urls),
            EXPIRY_LOG_FORMAT="json",  # the summary counts outcomes from these lines
            EXPIRY_HTTP_PORT="0",  # several consumers on one host: no port to share
            PYTHONUNBUFFERED="1",
        )
        if self.management_url is not None:
            env.update(EXPIRY_MANAGEMENT_URL=self.management_url)
        env.update(extra)
        return env

    async def _spawn(self, name: str, module: str, *args: str, **env: str) -> Child:
        log = self.logs / f"{name}.log"
        with log.open("wb") as out:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                module,
                *args,
                env=self.env(**env),
                stdout=out,
                stderr=out,
                start_new_session=True,  # Ctrl-C reaches the demo, which stops them in order
            )
        return Child(name, process, log)

    async def start(self, name: str, module: str, *args: str, **env: str) -> Child:
        """Start a long-running command."""
        child = await self._spawn(name, module, *args, **env)
        self.running.append(child)
        return child

    async def run(self, name: str, module: str, *args: str) -> None:
        """Run a command to completion; raise if it fails."""
        child = await self._spawn(name, module, *args)
        async with asyncio.timeout(STOP_TIMEOUT_SECONDS):
            code = await child.process.wait()
        if code != 0:
            raise RuntimeError(f"{name} exited {code}: {tail(child.log)}")

    def dead(self) -> list[Child]:
        """Long-running children that exited."""
        return [c for c in self.running if c.process.returncode is not None]

    async def stop(self, children: Sequence[Child]) -> dict[str, int]:
        """SIGTERM, then wait (SIGKILL past the timeout); return each exit code."""
        for child in children:
            if child.process.returncode is None:
                child.process.send_signal(signal.SIGTERM)
        codes = await asyncio.gather(*(_wait_or_kill(child) for child in children))
        return {child.name: code for child, code in zip(children, codes, strict=True)}


async def _wait_or_kill(child: Child) -> int:
    try:
        async with asyncio.timeout(STOP_TIMEOUT_SECONDS):
            return await child.process.wait()
    except TimeoutError:
        child.process.kill()
        return await child.process.wait()


def tail(log: Path, lines: int = 3) -> str:
    """The last lines a child wrote."""
    text = log.read_text(errors="replace").strip().splitlines()
    return " | ".join(text[-lines:]) or "(no output)"
