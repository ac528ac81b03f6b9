"""Unit tests for service.errors.classify: one table, every library error."""

from __future__ import annotations

import asyncpg
import pytest
from aiormq.exceptions import AMQPConnectionError, ChannelClosed

from service import errors
from service.errors import (
    ConcurrentUpdate,
    Disposition,
    PoisonMessage,
    PublishNotConfirmed,
    UnknownReservation,
    classify,
)

T, P = Disposition.TRANSIENT, Disposition.PERMANENT


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (PoisonMessage("poison.not-json"), (P, "poison.not-json")),
        (UnknownReservation(), (P, errors.UNKNOWN_RESERVATION)),
        (asyncpg.SerializationError("x"), (T, errors.DB_CONFLICT)),
        (asyncpg.DeadlockDetectedError("x"), (T, errors.DB_CONFLICT)),
        (ConcurrentUpdate(), (T, errors.DB_CONFLICT)),
        (asyncpg.LockNotAvailableError("x"), (T, errors.DB_TIMEOUT)),
        (asyncpg.QueryCanceledError("x"), (T, errors.DB_TIMEOUT)),
        (TimeoutError(), (T, errors.DB_TIMEOUT)),
        (asyncpg.CannotConnectNowError("x"), (T, errors.DB_UNAVAILABLE)),
        (asyncpg.AdminShutdownError("x"), (T, errors.DB_UNAVAILABLE)),
        (asyncpg.ConnectionDoesNotExistError("x"), (T, errors.DB_UNAVAILABLE)),
        (ConnectionRefusedError(111, "refused"), (T, errors.DB_UNAVAILABLE)),
        (OSError("unreachable"), (T, errors.DB_UNAVAILABLE)),
        (asyncpg.UndefinedTableError("x"), (T, errors.DB_ERROR)),
        (AMQPConnectionError("x"), (T, errors.BROKER_UNAVAILABLE)),
        (ChannelClosed(), (T, errors.BROKER_UNAVAILABLE)),
        (PublishNotConfirmed(), (T, errors.BROKER_UNAVAILABLE)),
        (RuntimeError("?"), (T, errors.UNEXPECTED)),
    ],
)
def test_classify(exc: BaseException, expected: tuple[Disposition, str]) -> None:
    """Each error maps to one disposition and a stable class; unknown ones are transient."""
    assert classify(exc) == expected


def test_error_docstring_is_default_message() -> None:
    """A service error without a message says what its class means."""
    assert str(UnknownReservation()) == "The command names a reservation that does not exist."
