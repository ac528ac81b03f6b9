"""Unit tests for service.core.domain: command parsing, message ids, outcomes."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from uuid import UUID

import pytest

from service.core.domain import (
    POISON_BAD_UUID,
    POISON_NOT_JSON,
    POISON_SCHEMA,
    Outcome,
    Status,
    command_body,
    message_id,
    outcome_of,
    parse_command,
)
from service.core.errors import ConcurrentUpdate, PoisonMessage, UnknownReservation

RID = UUID("6f1c2a8e-1d2b-4c3a-9e8f-0a1b2c3d4e5f")


def test_parse_command_accepts_the_contract_body() -> None:
    """A body as the contract spells it parses into an aware command."""
    body = json.dumps({"reservation_id": str(RID), "hold_until": "2026-11-30T10:00:00.250+01:00"})
    command = parse_command(body.encode())
    assert command.reservation_id == RID
    assert command.hold_until == datetime(2026, 11, 30, 9, 0, 0, 250000, tzinfo=UTC)


def test_parse_command_ignores_unknown_fields() -> None:
    """Extra fields from a newer producer are ignored, not fatal."""
    body = {"reservation_id": str(RID), "hold_until": "2026-11-30T10:00:00Z", "note": "x"}
    assert parse_command(json.dumps(body).encode()).reservation_id == RID


@pytest.mark.parametrize(
    ("body", "error_class"),
    [
        (b"", POISON_NOT_JSON),
        (b"not json", POISON_NOT_JSON),
        (b"\xff\xfe\x00garbage", POISON_NOT_JSON),
        (b"[1, 2]", POISON_NOT_JSON),
        (b'"a string"', POISON_NOT_JSON),
        (b"{}", POISON_SCHEMA),
        (b'{"reservation_id": "6f1c2a8e-1d2b-4c3a-9e8f-0a1b2c3d4e5f"}', POISON_SCHEMA),
        (b'{"reservation_id": "nope", "hold_until": "2026-11-30T10:00:00Z"}', POISON_BAD_UUID),
        (b'{"reservation_id": 12, "hold_until": "2026-11-30T10:00:00Z"}', POISON_BAD_UUID),
        (
            b'{"reservation_id": "6f1c2a8e-1d2b-4c3a-9e8f-0a1b2c3d4e5f", '
            b'"hold_until": "2026-11-30T10:00:00"}',
            POISON_SCHEMA,
        ),
        (
            b'{"reservation_id": "6f1c2a8e-1d2b-4c3a-9e8f-0a1b2c3d4e5f", "hold_until": null}',
            POISON_SCHEMA,
        ),
    ],
)
def test_parse_command_names_what_is_wrong(body: bytes, error_class: str) -> None:
    """Any unusable body raises PoisonMessage with a stable class, never anything else."""
    with pytest.raises(PoisonMessage) as caught:
        parse_command(body)
    assert caught.value.error_class == error_class


def test_poison_reason_never_echoes_the_body() -> None:
    """The reason names the field, not the value that was sent."""
    secret = "call-me-at-555-0100"
    body = json.dumps({"reservation_id": str(RID), "hold_until": secret}).encode()
    with pytest.raises(PoisonMessage) as caught:
        parse_command(body)
    assert secret not in str(caught.value)
    assert "hold_until" in str(caught.value)


def test_message_id_is_stable_across_time_zones() -> None:
    """The same deadline in any offset gives the same id: integer epoch milliseconds."""
    utc = datetime(2026, 11, 30, 9, 0, 0, 250000, tzinfo=UTC)
    paris = utc.astimezone(timezone(timedelta(hours=1)))
    assert message_id(RID, utc) == f"expire:{RID}:1796029200250"
    assert message_id(RID, paris) == message_id(RID, utc)


def test_command_body_round_trips() -> None:
    """What the producer writes, the consumer reads back unchanged."""
    deadline = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
    command = parse_command(command_body(RID, deadline))
    assert (command.reservation_id, command.hold_until) == (RID, deadline)
    assert json.loads(command_body(RID, deadline)) == {
        "reservation_id": str(RID),
        "hold_until": "2026-11-30T09:00:00+00:00",
    }


@pytest.mark.parametrize(
    "deadline",
    [
        datetime(2026, 11, 30, 9, 0, tzinfo=UTC),
        datetime(2026, 11, 30, 9, 0, 0, 123456, tzinfo=timezone(timedelta(hours=5, minutes=30))),
        datetime(2026, 3, 1, 23, 59, 59, 1000, tzinfo=timezone(timedelta(hours=-7))),
    ],
)
def test_command_body_is_the_compact_json_of_the_contract(deadline: datetime) -> None:
    """The hand-built body is byte for byte what json.dumps writes."""
    expected = {"reservation_id": str(RID), "hold_until": deadline.isoformat()}
    assert command_body(RID, deadline) == json.dumps(expected, separators=(",", ":")).encode()


@pytest.mark.parametrize(
    ("won", "status", "due", "expected"),
    [
        (True, "held", True, Outcome.EXPIRED),
        (False, "expired", True, Outcome.ALREADY_DONE),
        (False, "consumed", True, Outcome.NOT_ELIGIBLE),
        (False, "consumed", False, Outcome.NOT_ELIGIBLE),
        (False, "held", False, Outcome.NOT_ELIGIBLE),
    ],
)
def test_outcome_of(won: bool, status: str, due: bool, expected: Outcome) -> None:
    """Every row state maps to one success outcome."""
    assert outcome_of(won=won, status=status, due=due) is expected


def test_outcome_of_a_missing_row_is_unknown_reservation() -> None:
    """A command for a reservation that does not exist is a permanent error."""
    with pytest.raises(UnknownReservation):
        outcome_of(won=False, status=None, due=False)


def test_outcome_of_held_and_due_but_lost_is_retried() -> None:
    """A lost update on a row that still looks eligible is never guessed at."""
    with pytest.raises(ConcurrentUpdate):
        outcome_of(won=False, status=Status.HELD, due=True)
