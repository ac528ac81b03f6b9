"""The reservation state machine and the expiration command: pure, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from uuid import UUID

from pydantic import AwareDatetime, BaseModel, ConfigDict, ValidationError

from service.core.errors import ConcurrentUpdate, PoisonMessage, UnknownReservation


class Status(StrEnum):
    """A reservation's state, exactly as stored in ``reservations.status``."""

    HELD = "held"
    EXPIRED = "expired"
    CONSUMED = "consumed"


FINAL = frozenset({Status.EXPIRED, Status.CONSUMED})


class Outcome(StrEnum):
    """What one expiration command did; every outcome is a success (ack)."""

    EXPIRED = "expired"  # this delivery made the transition
    ALREADY_DONE = "already-done"  # a duplicate: the hold was expired before
    NOT_ELIGIBLE = "not-eligible"  # consumed, or not due yet


# Error classes of unusable bodies.
POISON_NOT_JSON = "poison.not-json"
POISON_SCHEMA = "poison.schema"
POISON_BAD_UUID = "poison.bad-uuid"


class ExpireCommand(BaseModel):
    """The body of an expiration command."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    reservation_id: UUID
    hold_until: AwareDatetime


def parse_command(body: bytes) -> ExpireCommand:
    """Parse a message body, or raise ``PoisonMessage`` naming what is wrong."""
    try:
        return ExpireCommand.model_validate_json(body)
    except ValidationError as exc:
        raise _poison(exc) from None


def _poison(exc: ValidationError) -> PoisonMessage:
    errors = exc.errors(include_url=False, include_input=False)
    first = errors[0]
    kind = first["type"]
    field = ".".join(str(part) for part in first["loc"]) or "body"
    if kind in ("json_invalid", "json_type", "model_type"):
        return PoisonMessage(POISON_NOT_JSON, "body is not a JSON object")
    if field == "reservation_id" and kind.startswith("uuid"):
        return PoisonMessage(POISON_BAD_UUID, "reservation_id is not a UUID")
    return PoisonMessage(POISON_SCHEMA, f"{field}: {first['msg']}")


def epoch_millis(moment: datetime) -> int:
    """Integer milliseconds since the Unix epoch (an aware datetime)."""
    return round(moment.timestamp() * 1000)


def message_id(reservation_id: UUID, hold_until: datetime) -> str:
    """The stable message id: the same every time the same hold is published."""
    return f"expire:{reservation_id}:{epoch_millis(hold_until)}"


def command_body(reservation_id: UUID, hold_until: datetime) -> bytes:
    """The JSON body of a command, as the contract spells it (a numeric UTC offset)."""
    if hold_until.tzinfo is None:
        raise ValueError("hold_until must be timezone-aware")
    # Neither a UUID nor an ISO 8601 time has a character JSON must escape: the
    # same bytes json.dumps gives, for less (the scan builds many).
    when = hold_until.isoformat()
    return f'{{"reservation_id":"{reservation_id}","hold_until":"{when}"}}'.encode()


# What the guarded update gives the worker (the database adapter fills them in).


@dataclass(frozen=True)
class Expiry:
    """What one guarded update did, and (if it expired the hold) the lag since its deadline
    and the time since the scan's confirmed publish of it (both by the database's clock)."""

    outcome: Outcome
    lag_seconds: float | None
    since_published_seconds: float | None = None


@dataclass(frozen=True)
class BatchRow:
    """What the batched update saw and did for one reservation."""

    won: bool
    lag: float | None
    status: str | None
    due: bool
    since_published: float | None = None


def outcome_of(*, won: bool, status: str | None, due: bool) -> Outcome:
    """Name the outcome of a guarded update from what the database saw.

    ``won`` says whether this update made the transition; ``status`` and
    ``due`` describe the row as it is now (``status`` is None if no row).
    """
    if won:
        return Outcome.EXPIRED
    if status is None:
        raise UnknownReservation
    if status == Status.EXPIRED:
        return Outcome.ALREADY_DONE
    if status == Status.CONSUMED or not due:
        return Outcome.NOT_ELIGIBLE
    # Held and due, yet the guarded update did not win: the row changed while
    # the update ran (a deadline moved, say). Try again later; never guess.
    raise ConcurrentUpdate


def duplicate_outcome(first: Outcome) -> Outcome:
    """What a second copy of a command in the same batch amounts to, given the first's outcome.

    The same as handling the copies one after the other: once expired, the
    next copy finds it already done; a hold not eligible stays not eligible.
    """
    return Outcome.NOT_ELIGIBLE if first is Outcome.NOT_ELIGIBLE else Outcome.ALREADY_DONE
