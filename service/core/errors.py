"""The service's exception tree, dispositions and error class names: pure.

Library errors are mapped onto them in one place, ``service.adapters.classify``.
"""

from __future__ import annotations

from enum import StrEnum


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


class RowLocked(TransientError):
    """Another transaction holds the reservation's row, and every connection that may
    wait for a row is waiting for one already."""


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
# A row (an audit row: its `at`) falls past the last weekly partition: retention has not
# made the weeks ahead. Transient: the next retention run makes them.
DB_NO_PARTITION = "db.no-partition"
BROKER_UNAVAILABLE = "broker.unavailable"
UNKNOWN_RESERVATION = "unknown-reservation"
CONSUMER_CRASH = "consumer-crash"
UNEXPECTED = "unexpected"
