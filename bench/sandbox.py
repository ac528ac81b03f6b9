"""The benchmark's own database and vhost (``service/demo/workspace.py``): a fresh name,
created at the start, removed at the end whatever happened."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator, Callable

from bench.config import Endpoints
from service.adapters.amqp.management import Management
from service.demo.workspace import Sandbox, sandbox_created

__all__ = ["Sandbox", "created", "new_name"]


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
