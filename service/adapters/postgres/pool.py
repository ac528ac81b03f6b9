"""The pool and single connections: every session carries the lock and statement timeouts."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from service.core.redaction import redact
from service.settings import Settings

if TYPE_CHECKING:  # the stubs make these generic; the runtime classes are not
    Pool: TypeAlias = asyncpg.Pool[asyncpg.Record]
    Connection: TypeAlias = asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]
    PlainConnection: TypeAlias = asyncpg.Connection[asyncpg.Record]
else:
    Pool = asyncpg.Pool
    Connection = asyncpg.Connection | PoolConnectionProxy
    PlainConnection = asyncpg.Connection


DB_NOW = "SELECT now()"


CLOCK_NOW = "SELECT clock_timestamp()"


PING = "SELECT 1"


def _connect_options(
    settings: Settings, application_name: str, *, flushed: bool = True
) -> dict[str, Any]:
    server_settings = {
        "application_name": application_name,
        "lock_timeout": str(settings.lock_timeout_ms),
        "statement_timeout": str(settings.statement_timeout_ms),
    }
    if not flushed:
        server_settings["synchronous_commit"] = "off"
    return {
        "timeout": settings.db_connect_timeout_seconds,
        "command_timeout": settings.statement_timeout_ms / 1000 + 5,
        "server_settings": server_settings,
    }


async def create_pool(
    settings: Settings, *, application_name: str, size: int, flushed: bool = True
) -> Pool:
    """Open a pool whose sessions carry the lock and statement timeouts. ``flushed=False``:
    its commits return before PostgreSQL has flushed them to disk (``synchronous_commit
    off``), for writes that a crash may lose without harm (the relay's claims and marks)."""
    try:
        return await asyncpg.create_pool(
            settings.database_url,
            min_size=1,
            max_size=size,
            reset=_keep_session,
            **_connect_options(settings, application_name, flushed=flushed),
        )
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise _unreachable(settings, exc) from exc


async def _keep_session(_conn: PlainConnection) -> None:
    """Pool release without asyncpg's default reset (one round trip per release).

    Safe because the service never leaves session state on a pooled connection:
    no LISTEN, no session SET (timeouts come with the connection), no advisory
    locks; an open transaction is still rolled back by asyncpg itself.
    """


async def connect(settings: Settings, *, application_name: str) -> PlainConnection:
    """Open one connection (for the scan and the migrations)."""
    try:
        return await asyncpg.connect(
            settings.database_url, **_connect_options(settings, application_name)
        )
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise _unreachable(settings, exc) from exc


class _Closable(Protocol):
    async def close(self) -> None: ...


C = TypeVar("C", bound=_Closable)


@contextlib.asynccontextmanager
async def _closed_at_end(opening: Awaitable[C]) -> AsyncIterator[C]:
    opened = await opening
    try:
        yield opened
    finally:
        await opened.close()


def connected(
    settings: Settings, *, name: str
) -> contextlib.AbstractAsyncContextManager[PlainConnection]:
    """One connection (``application_name`` ``name``) for the block, closed at its end."""
    return _closed_at_end(connect(settings, application_name=name))


def pooled(
    settings: Settings, *, name: str, size: int, flushed: bool = True
) -> contextlib.AbstractAsyncContextManager[Pool]:
    """A pool of at most ``size`` connections for the block, closed at its end
    (``flushed``: see ``create_pool``)."""
    return _closed_at_end(create_pool(settings, application_name=name, size=size, flushed=flushed))


def _unreachable(settings: Settings, exc: BaseException) -> ConnectionError:
    reason = str(exc).strip() or type(exc).__name__
    return ConnectionError(redact(f"cannot reach PostgreSQL at {settings.database_url}: {reason}"))


async def ping(conn: Connection) -> None:
    """A round trip: the connection works."""
    await conn.fetchval(PING)


async def answers(pool: Pool, timeout: float) -> bool:
    """Whether a connection of ``pool`` makes a round trip within ``timeout`` (a process's
    readiness): any failure is a "no", which is the answer."""
    try:
        async with asyncio.timeout(timeout), pool.acquire() as conn:
            await ping(conn)
    except Exception:  # any failure means "not ready", which is the answer
        return False
    return True


async def db_now(conn: Connection) -> datetime:
    """The database's clock: the only clock that decides what is due."""
    value: datetime = await conn.fetchval(DB_NOW)
    return value


async def clock_drift(conn: Connection) -> float:
    """This process's wall clock minus the database's, in seconds (positive: ours is
    ahead), to within half a round trip: the database's reading is taken to fall at
    the middle of the query."""
    before = time.time()
    database: datetime = await conn.fetchval(CLOCK_NOW)
    after = time.time()
    return (before + after) / 2 - database.timestamp()
