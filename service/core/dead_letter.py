"""What a dead-lettered message says about itself, as a record: pure, no I/O.

A dead letter arrives in one of two shapes: a copy the consumer published
(with ``x-expiry-*`` headers: why, how many attempts, since when, by whom), or
a message the broker dead-lettered itself (with ``x-death`` and no verdict of
ours): the delivery limit was reached, or a consumer rejected it. Either way
its headers are untrusted input: every field of the record is read through
``service.core.inputs`` into a bounded value, so that any record built here can be
stored, and ``build_record`` never raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from service.core.domain import parse_command
from service.core.errors import PoisonMessage
from service.core.inputs import (
    MAX_ATTEMPT,
    MAX_DELIVERY_COUNT,
    bounded_int,
    header_text,
    headers_of,
    mask_excerpt,
    message_id_of,
    recent_millis,
    text_of,
)
from service.core.retry import DeadLetter, GiveUp, Retry

ATTEMPT_HEADER = "x-expiry-attempt"
FIRST_SEEN_HEADER = "x-expiry-first-seen"
LAST_SEEN_HEADER = "x-expiry-last-seen"
ERROR_CLASS_HEADER = "x-expiry-error-class"
REASON_HEADER = "x-expiry-reason"
GIVE_UP_HEADER = "x-expiry-give-up"
WORKER_HEADER = "x-expiry-worker"
REPLAYED_BY_HEADER = "x-expiry-replayed-by"
# A replay's link to the trace of the job it replays: that job's W3C traceparent.
REPLAY_OF_HEADER = "x-expiry-replay-of"

EXCERPT_BYTES = 64
NAME_LIMIT = 64  # error classes and give-up reasons: short names
# Error classes of dead letters the broker made, by the x-death reason.
DELIVERY_LIMIT_CLASS = "delivery-limit"
REJECTED_CLASS = "rejected"
BROKER_CLASSES = {
    "delivery_limit": (DELIVERY_LIMIT_CLASS, GiveUp.DELIVERY_LIMIT),
    "rejected": (REJECTED_CLASS, GiveUp.REJECTED),
    "expired": ("expired", GiveUp.EXPIRED),
    "maxlen": ("max-length", GiveUp.MAX_LENGTH),
}


@dataclass(frozen=True)
class DeadLetterRecord:
    """Everything an operator is shown about one dead letter (no message content)."""

    message_id: str
    reservation_id: UUID | None
    hold_until: datetime | None
    error_class: str
    give_up: str
    reason: str
    attempts: int
    first_seen: datetime
    last_seen: datetime
    worker: str
    body_excerpt: str | None


def copy_headers(
    decision: Retry | DeadLetter,
    *,
    attempt: int,
    first_seen_ms: int,
    error_class: str,
    reason: str,
    worker: str,
    now_ms: int,
) -> dict[str, Any]:
    """Our headers on a failed delivery's copy: its history for the next attempt (a retry:
    the attempt it will be) or, dead-lettered, the verdict a record is built from."""
    headers: dict[str, Any] = {
        FIRST_SEEN_HEADER: first_seen_ms,
        ERROR_CLASS_HEADER: error_class,
        REASON_HEADER: reason,
        WORKER_HEADER: worker,
    }
    if isinstance(decision, Retry):
        headers[ATTEMPT_HEADER] = decision.next_attempt
    else:
        headers[ATTEMPT_HEADER] = attempt
        headers[GIVE_UP_HEADER] = decision.why.value
        headers[LAST_SEEN_HEADER] = now_ms
    return headers


def stable_message_id(message_id: object, body: bytes) -> str:
    """The message id (cleaned), or one derived from the body when the sender set none."""
    return message_id_of(message_id, body)


def _ms(value: int) -> datetime:
    return datetime.fromtimestamp(value / 1000, UTC)


def latest_death(headers: Mapping[str, Any]) -> Mapping[str, Any]:
    """The most recent ``x-death`` entry (the broker lists them newest first), or ``{}``."""
    deaths = headers.get("x-death")
    if isinstance(deaths, list) and deaths:
        return headers_of(deaths[0])
    return {}


@dataclass(frozen=True)
class _Verdict:
    error_class: str
    give_up: str
    reason: str
    attempts: int
    worker: str
    last_ms: int


def _our_verdict(headers: Mapping[str, Any], now_ms: int) -> _Verdict:
    """A copy our consumer published: its ``x-expiry-*`` headers say why."""
    return _Verdict(
        error_class=header_text(headers, ERROR_CLASS_HEADER, "unexpected", NAME_LIMIT),
        give_up=header_text(headers, GIVE_UP_HEADER, GiveUp.PERMANENT, NAME_LIMIT),
        reason=header_text(headers, REASON_HEADER, "-"),
        attempts=bounded_int(headers.get(ATTEMPT_HEADER), 1, MAX_ATTEMPT) or 1,
        worker=header_text(headers, WORKER_HEADER, "-"),
        last_ms=recent_millis(headers.get(LAST_SEEN_HEADER), now_ms) or now_ms,
    )


def _broker_verdict(headers: Mapping[str, Any], death: Mapping[str, Any], now_ms: int) -> _Verdict:
    """A message the broker dead-lettered: its ``x-death`` entry says why."""
    why = text_of(death.get("reason"), NAME_LIMIT) or "unknown"
    error_class, give_up = BROKER_CLASSES.get(why, ("broker-dead-lettered", GiveUp.BROKER))
    deliveries = bounded_int(headers.get("x-delivery-count"), 0, MAX_DELIVERY_COUNT) or 0
    count = bounded_int(death.get("count"), 1, MAX_DELIVERY_COUNT) or 1
    return _Verdict(
        error_class=error_class,
        give_up=give_up,
        reason=f"broker dead-lettered it ({why})",
        attempts=min(MAX_ATTEMPT, max(1, deliveries + 1, count)),
        worker="broker",
        last_ms=recent_millis(death.get("time"), now_ms) or now_ms,
    )


def build_record(
    headers: object, body: bytes, message_id: object, now: datetime
) -> DeadLetterRecord:
    """The record of one dead letter, from its headers and body (never raises)."""
    table = headers_of(headers)
    now_ms = round(now.timestamp() * 1000)
    if GIVE_UP_HEADER in table:
        verdict = _our_verdict(table, now_ms)
    else:
        verdict = _broker_verdict(table, latest_death(table), now_ms)
    first_ms = recent_millis(table.get(FIRST_SEEN_HEADER), now_ms) or verdict.last_ms
    reservation_id, hold_until, excerpt = _identify(body)
    return DeadLetterRecord(
        message_id=stable_message_id(message_id, body),
        reservation_id=reservation_id,
        hold_until=hold_until,
        error_class=verdict.error_class,
        give_up=verdict.give_up,
        reason=verdict.reason,
        attempts=verdict.attempts,
        first_seen=_ms(min(first_ms, verdict.last_ms)),
        last_seen=_ms(verdict.last_ms),
        worker=verdict.worker,
        body_excerpt=excerpt,
    )


def reduced_record(record: DeadLetterRecord, why: str) -> DeadLetterRecord:
    """The record without what a database could refuse: no reservation, no deadline, no
    excerpt, and a reason that says why it was reduced."""
    return replace(
        record,
        reservation_id=None,
        hold_until=None,
        body_excerpt=None,
        reason=text_of(f"record reduced ({why}); was: {record.reason}") or "record reduced",
    )


def unreadable_record(message_id: object, body: bytes, now: datetime, why: str) -> DeadLetterRecord:
    """The least a record can say: the message could not even be read into a record."""
    return DeadLetterRecord(
        message_id=stable_message_id(message_id, body),
        reservation_id=None,
        hold_until=None,
        error_class="unreadable",
        give_up=GiveUp.UNREADABLE,
        reason=text_of(f"the dead letter could not be read ({why})") or "unreadable",
        attempts=1,
        first_seen=now,
        last_seen=now,
        worker="-",
        body_excerpt=None,
    )


def _identify(body: bytes) -> tuple[UUID | None, datetime | None, str | None]:
    try:
        command = parse_command(body)
    except PoisonMessage:
        return None, None, mask_excerpt(body, EXCERPT_BYTES)
    try:  # a deadline a database may refuse (beyond year 1 or 9999 once in UTC)
        hold_until = command.hold_until.astimezone(UTC)
    except (OverflowError, ValueError):
        return command.reservation_id, None, None
    return command.reservation_id, hold_until, None
