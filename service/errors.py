"""The service's exception tree and the one place library errors are classified."""

from __future__ import annotations

from enum import StrEnum

import aiormq.exceptions
import asyncpg
import asyncpg.exceptions._base as asyncpg_base


class ServiceError(Exception):
    """The expiry service failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigError(ServiceError):
    """A setting is invalid."""


class UsageError(ServiceError):
    """The command was asked for something it cannot do."""


class TopologyMismatch(ServiceError):
    """The broker holds a queue or exchange declared with other arguments."""


class PoisonMessage(ServiceError):
    """The message body is unusable."""

    def __init__(self, error_class: str, message: str | None = None) -> None:
        super().__init__(message)
        self.error_class = error_class


class UnknownReservation(ServiceError):
    """The command names a reservation that does not exist."""


class CrashLoop(ServiceError):
    """The command killed every consumer that handled it."""


class TransientError(ServiceError):
    """A database or broker hiccup; the command is retried."""


class ConcurrentUpdate(TransientError):
    """The reservation changed while it was being expired."""


class PublishNotConfirmed(ServiceError):
    """The broker did not confirm a publish (nack, return or timeout)."""


class Disposition(StrEnum):
    """What to do with a failed delivery."""

    TRANSIENT = "transient"
    PERMANENT = "permanent"


# Error classes: stable names used in logs, headers, metrics and dead-letter records.
DB_UNAVAILABLE = "db.unavailable"
DB_TIMEOUT = "db.timeout"
DB_CONFLICT = "db.conflict"
DB_ERROR = "db.error"
DB_DATA = "db.data"
BROKER_UNAVAILABLE = "broker.unavailable"
UNKNOWN_RESERVATION = "unknown-reservation"
CONSUMER_CRASH = "consumer-crash"
UNEXPECTED = "unexpected"

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
_DB_TIMEOUT = (asyncpg.QueryCanceledError, asyncpg.LockNotAvailableError, TimeoutError)
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
