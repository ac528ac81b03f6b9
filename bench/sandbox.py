"""The benchmark's own database and vhost (``service/demo/workspace.py``): a fresh name,
created at the start, removed at the end whatever happened."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path

from bench.config import Endpoints
from bench.procs import Processes, child_env
from service.adapters.amqp.management import Management
from service.demo.workspace import Sandbox, sandbox_created

__all__ = ["Sandbox", "created", "deployed", "new_name"]

DEPLOY_TIMEOUT_SECONDS = 120


def new_name() -> str:
    """A fresh name for the database and the vhost: ``bench_<random>``."""
    return f"bench_{secrets.token_hex(4)}"


@contextlib.asynccontextmanager
async def created(
    endpoints: Endpoints, name: str, say: Callable[[str], None]
) -> AsyncIterator[Sandbox]:
    """Create the database and the vhost ``name`` beside the given servers; remove both
    afterwards, whatever happened, and say so."""
    management = Management(endpoints.management_url)
    made = False
    try:
        async with sandbox_created(
            endpoints.database_url, (endpoints.amqp_url,), management, database=name
        ) as sandbox:
            made = True
            yield sandbox
    finally:
        if made:
            say(f"removed the database and the vhost {name}")


@contextlib.asynccontextmanager
async def deployed(
    endpoints: Endpoints,
    name: str,
    logs: Path,
    say: Callable[[str], None],
    overrides: Iterable[tuple[str, str]] = (),
) -> AsyncIterator[tuple[Sandbox, Processes]]:
    """The sandbox ``name``, migrated and its topology declared as a deploy does, and the
    children's ``Processes`` (their logs in ``logs``, the service's settings ``overrides``);
    every child still running is stopped at the end, then the sandbox removed."""
    async with created(endpoints, name, say) as sandbox:
        env = child_env(
            os.environ,
            database_url=sandbox.database_url,
            amqp_url=sandbox.amqp_url,
            management_url=endpoints.management_url,
            overrides=overrides,
        )
        procs = Processes(env, logs)
        try:
            await procs.run("000-migrate", "service.migrate", timeout=DEPLOY_TIMEOUT_SECONDS)
            await procs.run("001-declare", "service.declare", timeout=DEPLOY_TIMEOUT_SECONDS)
            yield sandbox, procs
        finally:
            await procs.stop_all()
