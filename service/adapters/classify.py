"""The one place library errors (asyncpg, aiormq) are classified into a disposition
and a stable error class name (``service.core.errors``)."""

from __future__ import annotations

import aiormq.exceptions
import asyncpg
import asyncpg.exceptions._base as asyncpg_base

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
