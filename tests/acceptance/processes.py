"""The commands as a user runs them: ``python -m ...`` from the repository root, to
completion (``run``) or in the background (``start`` / ``stop``)."""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
from typing import IO

from tests.support import Endpoints, start_module
from tests.support import run_module as run

__all__ = ["base_env", "endpoints_env", "output_so_far", "run", "start", "stop"]

_LOGS: dict[int, IO[bytes]] = {}


def base_env() -> dict[str, str]:
    """This environment without any ``EXPIRY_*`` setting."""
    return {k: v for k, v in os.environ.items() if not k.startswith("EXPIRY_")}


def endpoints_env(endpoints: Endpoints) -> dict[str, str]:
    """``base_env()`` naming the test run's servers, as the demo and the benchmark read them."""
    return base_env() | {
        "DATABASE_URL": endpoints.database_url,
        "AMQP_URL": endpoints.amqp_url,
        "RABBITMQ_MANAGEMENT_URL": endpoints.management_url,
    }


async def start(module: str, *args: str, env: dict[str, str]) -> asyncio.subprocess.Process:
    """Start ``python -m module`` in the background, its output going to a file."""
    log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop(); a pipe would fill up)
    process = await start_module(module, *args, env=env, output=log)
    _LOGS[process.pid] = log
    return process


def output_so_far(process: asyncio.subprocess.Process) -> str:
    """What a process started by ``start`` has written so far."""
    log = _LOGS[process.pid]
    log.flush()
    with open(log.fileno(), "rb", closefd=False) as reader:
        reader.seek(0)
        return reader.read().decode(errors="replace")


async def stop(process: asyncio.subprocess.Process, sig: int = signal.SIGTERM) -> tuple[int, str]:
    """Signal a process, wait for it; return its exit code and what it wrote."""
    if process.returncode is None:
        process.send_signal(sig)
    async with asyncio.timeout(60):
        code = await process.wait()
    log = _LOGS.pop(process.pid)
    log.seek(0)
    output = log.read().decode()
    log.close()
    return code, output
