"""Databases of their own for a run: created (optionally a copy of a template), then
dropped. The demo, the benchmark and the tests work in one (with a vhost beside it:
``service.demo.workspace.sandbox_created``); never for the service's own work."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import asyncpg

from service.core.dsn import with_database
from service.core.redaction import redact

ADMIN_TIMEOUT_SECONDS = 10.0


def _identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def admin_sql(admin_url: str, statement: str) -> None:
    """One statement on a connection of its own (``CREATE`` or ``DROP DATABASE``)."""
    try:
        conn = await asyncpg.connect(admin_url, timeout=ADMIN_TIMEOUT_SECONDS)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        raise ConnectionError(redact(f"cannot reach PostgreSQL at {admin_url}: {exc}")) from None
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


async def create_database(admin_url: str, name: str, *, template: str | None = None) -> str:
    """Create database ``name`` on ``admin_url``'s server (a copy of ``template``); its URL."""
    copy = f" TEMPLATE {_identifier(template)}" if template else ""
    await admin_sql(admin_url, f"CREATE DATABASE {_identifier(name)}{copy}")
    return with_database(admin_url, name)


async def drop_database(admin_url: str, name: str) -> None:
    """Drop database ``name`` if it exists, ending its sessions."""
    await admin_sql(admin_url, f"DROP DATABASE IF EXISTS {_identifier(name)} WITH (FORCE)")


@contextlib.asynccontextmanager
async def database_created(
    admin_url: str, name: str, *, template: str | None = None, keep: bool = False
) -> AsyncIterator[str]:
    """Database ``name`` (its URL) for the block; dropped afterwards unless ``keep``."""
    url = await create_database(admin_url, name, template=template)
    try:
        yield url
    finally:
        if not keep:
            await drop_database(admin_url, name)
