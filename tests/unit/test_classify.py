"""Unit tests for service.adapters.classify: one table, every library error."""

from __future__ import annotations

import asyncpg
import asyncpg.exceptions._base as asyncpg_base
import pytest
from aiormq.exceptions import AMQPConnectionError, ChannelClosed

from service.adapters.classify import classify, refuses_values
from service.core import errors
from service.core.errors import (
    ConcurrentUpdate,
    Disposition,
    PoisonMessage,
    PublishNotConfirmed,
    UnknownReservation,
)

T, P = Disposition.TRANSIENT, Disposition.PERMANENT


def _violation(*, constraint: str | None) -> asyncpg.CheckViolationError:
    """A check violation as the server reports it (its fields, as asyncpg reads them)."""
    fields = {"C": "23514", "M": "new row violates a check", "t": "reservation_transitions"}
    if constraint is not None:
        fields["n"] = constraint
    violation: asyncpg.CheckViolationError = asyncpg.CheckViolationError.new(fields)
    return violation


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
        (asyncpg.NumericValueOutOfRangeError("x"), (P, errors.DB_DATA)),
        (asyncpg.CharacterNotInRepertoireError("x"), (P, errors.DB_DATA)),
        (asyncpg.CheckViolationError("x"), (P, errors.DB_DATA)),
        # A check of a partition names its constraint; a row past the last week names
        # only the partitioned table: retention has not made the weeks ahead.
        (_violation(constraint="console_logins_outcome_check"), (P, errors.DB_DATA)),
        (_violation(constraint=None), (T, errors.DB_NO_PARTITION)),
        (asyncpg_base.DataError("invalid input for query argument $3"), (P, errors.DB_DATA)),
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


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (asyncpg.CharacterNotInRepertoireError("x"), True),
        (asyncpg_base.DataError("x"), True),
        (OverflowError("date value out of range"), True),
        (ValueError("x"), True),
        (asyncpg.CannotConnectNowError("x"), False),
        (asyncpg.ConnectionDoesNotExistError("x"), False),
        (OSError("unreachable"), False),
        (TimeoutError(), False),
    ],
)
def test_refuses_values_tells_the_values_from_the_database(
    exc: BaseException, expected: bool
) -> None:
    """Values the database refuses are told apart from a database that is away."""
    assert refuses_values(exc) is expected
