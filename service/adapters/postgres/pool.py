"""The pool and single connections: every transaction runs under the lock and statement
timeouts.

Straight to PostgreSQL (or through a pooler in session mode) a session carries them from
its start-up. Behind a transaction pooler (``EXPIRY_DB_POOLER=transaction``: PgBouncer's
``pool_mode = transaction``, RDS Proxy, Supavisor's transaction port) a session is
handed to other clients between transactions, and the pooler refuses start-up
parameters it does not track: the connection sends ``application_name`` alone, each
transaction opened with ``transaction()`` sets the timeouts for itself (``SET LOCAL``,
one round trip), and asyncpg prepares no named statement (its statement cache off: an
unnamed statement is parsed again with each use). A statement outside a transaction is
then bounded by the client: ``command_timeout`` cancels it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias, TypeVar

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from service.core.dsn import parse_dsn
from service.core.redaction import redact
from service.core.tls_failures import refused, tls_failure
from service.settings import Settings

if TYPE_CHECKING:  # the stubs make these generic; the runtime classes are not
    Pool: TypeAlias = asyncpg.Pool[asyncpg.Record]
    Connection: TypeAlias = asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]
    PlainConnection: TypeAlias = asyncpg.Connection[asyncpg.Record]
else:
    Pool = asyncpg.Pool
    Connection = asyncpg.Connection | PoolConnectionProxy
    PlainConnection = asyncpg.Connection


class Session(asyncpg.Connection):
    """A connection that knows what each of its transactions must set (None: nothing,
    its start-up carried the timeouts)."""

    local_settings: str | None = None


IsolationLevel: TypeAlias = Literal["read_committed", "serializable", "repeatable_read"]


DB_NOW = "SELECT now()"


CLOCK_NOW = "SELECT clock_timestamp()"


PING = "SELECT 1"


def _connect_options(
    settings: Settings, application_name: str, *, flushed: bool = True
) -> dict[str, Any]:
    timeouts = {
        "lock_timeout": str(settings.lock_timeout_ms),
        "statement_timeout": str(settings.statement_timeout_ms),
    }
    if not flushed:
        timeouts["synchronous_commit"] = "off"
    options: dict[str, Any] = {
        "timeout": settings.db_connect_timeout_seconds,
        "command_timeout": settings.statement_timeout_ms / 1000 + 5,
        "connection_class": Session,
    }
    if settings.db_pooler == "transaction":
        options["server_settings"] = {"application_name": application_name}
        options["statement_cache_size"] = 0
    else:
        options["server_settings"] = {"application_name": application_name, **timeouts}
    return options


def session_settings(settings: Settings) -> tuple[Settings, str] | None:
    """The settings of a connection that keeps its session (a LISTEN lives on it), and
    the setting its URL comes from (what a refusal names): ``settings`` themselves and
    DATABASE_URL unless that goes through a transaction pooler, then
    EXPIRY_DB_SESSION_URL's; None when that is not given."""
    if settings.db_pooler != "transaction":
        return settings, "DATABASE_URL"
    if settings.db_session_url is None:
        return None
    session = settings.model_copy(
        update={"database_url": settings.db_session_url, "db_pooler": "none"}
    )
    return session, "EXPIRY_DB_SESSION_URL"


def local_settings(settings: Settings, *, flushed: bool = True) -> str | None:
    """What each transaction sets for itself (None: the session's start-up did)."""
    if settings.db_pooler != "transaction":
        return None
    local = [
        f"SET LOCAL lock_timeout = {int(settings.lock_timeout_ms)}",
        f"SET LOCAL statement_timeout = {int(settings.statement_timeout_ms)}",
    ]
    if not flushed:
        local.append("SET LOCAL synchronous_commit = off")
    return "; ".join(local)


def carries_timeouts(conn: Connection) -> bool:
    """Whether ``conn``'s session carries the timeouts (else only its transactions do)."""
    return getattr(conn, "local_settings", None) is None


@contextlib.asynccontextmanager
async def transaction(
    conn: Connection, *, isolation: IsolationLevel | None = None, readonly: bool = False
) -> AsyncIterator[None]:
    """A transaction (``conn.transaction()``: a savepoint inside another), with what the
    session could not carry set for it (behind a transaction pooler: the timeouts)."""
    async with conn.transaction(isolation=isolation, readonly=readonly):
        local: str | None = getattr(conn, "local_settings", None)
        if local is not None:
            await conn.execute(local)
        yield


async def create_pool(
    settings: Settings, *, application_name: str, size: int, flushed: bool = True
) -> Pool:
    """Open a pool whose sessions carry the lock and statement timeouts. ``flushed=False``:
    its commits return before PostgreSQL has flushed them to disk (``synchronous_commit
    off``), for writes that a crash may lose without harm (the relay's claims and marks)."""
    local = local_settings(settings, flushed=flushed)

    async def _init(conn: PlainConnection) -> None:
        if isinstance(conn, Session):
            conn.local_settings = local

    try:
        return await asyncpg.create_pool(
            settings.database_url,
            min_size=1,
            max_size=size,
            reset=_keep_session,
            init=_init,
            **_connect_options(settings, application_name, flushed=flushed),
        )
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise _unreachable(settings, exc) from exc


async def _keep_session(_conn: PlainConnection) -> None:
    """Pool release without asyncpg's default reset (one round trip per release).

    Safe because the service never leaves session state on a pooled connection:
    no LISTEN, no session SET (timeouts come with the connection or each transaction),
    no session advisory lock (``locks.py`` holds one in a transaction); an open
    transaction is still rolled back by asyncpg itself.
    """


async def connect(
    settings: Settings, *, application_name: str, setting: str = "DATABASE_URL"
) -> PlainConnection:
    """Open one connection (for the scan and the migrations; the relay's LISTEN, whose
    URL may be another ``setting``: the one a refusal names)."""
    try:
        conn: PlainConnection = await asyncpg.connect(
            settings.database_url, **_connect_options(settings, application_name)
        )
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise _unreachable(settings, exc, setting) from exc
    if isinstance(conn, Session):
        conn.local_settings = local_settings(settings)
    return conn


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


def _unreachable(
    settings: Settings, exc: BaseException, setting: str = "DATABASE_URL"
) -> Exception:
    """What a failed connect raises: ``TlsRefused`` (one line naming ``setting``, whose
    URL ``settings.database_url`` is; no retry helps) for a TLS failure, else a
    ``ConnectionError``."""
    why = tls_failure(exc)
    if why is not None:
        hosts = ", ".join(str(host) for host in parse_dsn(settings.database_url).hosts)
        return refused(setting, f"PostgreSQL at {hosts}", why)
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
