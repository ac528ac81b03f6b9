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
    DB_NO_PARTITION,
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

# In order, the first that matches wins (SQLSTATE-specific before the catch-all
# ``PostgresError``; a refused connection's ``OSError`` after the broker's).
_Kinds = type[BaseException] | tuple[type[BaseException], ...]
_RULES: tuple[tuple[_Kinds, Disposition, str], ...] = (
    (UnknownReservation, Disposition.PERMANENT, UNKNOWN_RESERVATION),
    (CrashLoop, Disposition.PERMANENT, CONSUMER_CRASH),
    (_DB_DATA, Disposition.PERMANENT, DB_DATA),
    (_DB_CONFLICT, Disposition.TRANSIENT, DB_CONFLICT),
    (_DB_TIMEOUT, Disposition.TRANSIENT, DB_TIMEOUT),
    (_BROKER, Disposition.TRANSIENT, BROKER_UNAVAILABLE),
    (_DB_UNAVAILABLE, Disposition.TRANSIENT, DB_UNAVAILABLE),
    (asyncpg.PostgresError, Disposition.TRANSIENT, DB_ERROR),
)


def classify(exc: BaseException) -> tuple[Disposition, str]:
    """Map an exception to its disposition and a stable error class name.

    Unknown errors count as transient: the attempt and age budgets stop them.
    """
    if isinstance(exc, PoisonMessage):
        return Disposition.PERMANENT, exc.error_class
    if no_partition(exc):
        return Disposition.TRANSIENT, DB_NO_PARTITION
    for kinds, disposition, error_class in _RULES:
        if isinstance(exc, kinds):
            return disposition, error_class
    return Disposition.TRANSIENT, UNEXPECTED


def no_partition(exc: BaseException) -> bool:
    """The row has no partition to go to (a check violation of the partitioned table
    itself, no constraint named): retention has not made the weeks ahead."""
    return (
        isinstance(exc, asyncpg.CheckViolationError)
        and getattr(exc, "constraint_name", None) is None
        and getattr(exc, "table_name", None) is not None
    )


def refuses_values(exc: BaseException) -> bool:
    """The database (or the driver, encoding them) refused the values themselves.

    Sending the same values again can only fail again: such a write must
    change what it writes, not wait.
    """
    if no_partition(exc):  # not the values: the week they belong to is missing
        return False
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
