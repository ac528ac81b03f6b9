"""The one place library errors (asyncpg, aiormq) are classified into a disposition
and a stable error class name (``service.core.errors``)."""

from __future__ import annotations

import aiormq.exceptions
import asyncpg
import asyncpg.exceptions._base as asyncpg_base

from service.adapters.postgres.schema import SchemaNotCurrent
from service.core.errors import (
    BROKER_UNAVAILABLE,
    CONSUMER_CRASH,
    DB_CONFLICT,
    DB_DATA,
    DB_ERROR,
    DB_TIMEOUT,
    DB_UNAVAILABLE,
    UNEXPECTED,
    UNKNOWN_RESERVATION,
    ConcurrentUpdate,
    CrashLoop,
    Disposition,
    PoisonMessage,
    PublishNotConfirmed,
    RowLocked,
    UnknownReservation,
)

# The values, not the database: PostgreSQL refused them (SQLSTATE classes 22
# and 23, or a size limit), or asyncpg could not encode them. Trying again
# cannot help.
_DB_DATA = (
    asyncpg.DataError,
    asyncpg.IntegrityConstraintViolationError,
    asyncpg.ProgramLimitExceededError,
    asyncpg_base.DataError,
)
_DB_CONFLICT = (asyncpg.SerializationError, asyncpg.DeadlockDetectedError, ConcurrentUpdate)
_DB_TIMEOUT = (asyncpg.QueryCanceledError, asyncpg.LockNotAvailableError, RowLocked, TimeoutError)
_DB_UNAVAILABLE = (
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.InterfaceError,
    ConnectionError,
    OSError,
)
_BROKER = (aiormq.exceptions.AMQPError, PublishNotConfirmed)


def classify(exc: BaseException) -> tuple[Disposition, str]:
    """Map an exception to its disposition and a stable error class name.

    Unknown errors count as transient: the attempt and age budgets stop them.
    """
    if isinstance(exc, PoisonMessage):
        return Disposition.PERMANENT, exc.error_class
    if isinstance(exc, UnknownReservation):
        return Disposition.PERMANENT, UNKNOWN_RESERVATION
    if isinstance(exc, CrashLoop):
        return Disposition.PERMANENT, CONSUMER_CRASH
    if isinstance(exc, _DB_DATA):
        return Disposition.PERMANENT, DB_DATA
    if isinstance(exc, _DB_CONFLICT):
        return Disposition.TRANSIENT, DB_CONFLICT
    if isinstance(exc, _DB_TIMEOUT):
        return Disposition.TRANSIENT, DB_TIMEOUT
    if isinstance(exc, _BROKER):
        return Disposition.TRANSIENT, BROKER_UNAVAILABLE
    if isinstance(exc, _DB_UNAVAILABLE):
        return Disposition.TRANSIENT, DB_UNAVAILABLE
    if isinstance(exc, asyncpg.PostgresError):
        return Disposition.TRANSIENT, DB_ERROR
    return Disposition.TRANSIENT, UNEXPECTED


def refuses_values(exc: BaseException) -> bool:
    """The database (or the driver, encoding them) refused the values themselves.

    Sending the same values again can only fail again: such a write must
    change what it writes, not wait.
    """
    return isinstance(exc, (*_DB_DATA, ValueError, TypeError, OverflowError))


# What reading PostgreSQL raises when it cannot be reached or refuses a statement.
DATABASE_ERRORS = (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)
# A table or a column the code needs does not exist: the database is not migrated, or
# was migrated by an older release.
_SCHEMA_MISSING = (asyncpg.UndefinedTableError, asyncpg.UndefinedColumnError)


def schema_missing(exc: BaseException) -> str | None:
    """What the database said is missing when ``exc``, one of its causes or, in a group,
    one of its exceptions is a table or a column that does not exist (``relation "x"
    does not exist``); None otherwise."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, (*_SCHEMA_MISSING, SchemaNotCurrent)):
            return str(current).strip() or type(current).__name__
        if isinstance(current, BaseExceptionGroup):
            pending += current.exceptions
        pending += [cause for cause in (current.__cause__, current.__context__) if cause]
    return None
