"""What a dead-lettered message says about itself, as a record: pure, no I/O.

A dead letter arrives in one of two shapes: a copy the consumer published
(with ``x-expiry-*`` headers: why, how many attempts, since when, by whom), or
a message the broker dead-lettered itself when the delivery limit was reached
(with ``x-death``, and no verdict of ours).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from service.domain import parse_command
from service.errors import PoisonMessage
from service.retry import GiveUp

ATTEMPT_HEADER = "x-expiry-attempt"
FIRST_SEEN_HEADER = "x-expiry-first-seen"
LAST_SEEN_HEADER = "x-expiry-last-seen"
ERROR_CLASS_HEADER = "x-expiry-error-class"
REASON_HEADER = "x-expiry-reason"
GIVE_UP_HEADER = "x-expiry-give-up"
WORKER_HEADER = "x-expiry-worker"
REPLAYED_BY_HEADER = "x-expiry-replayed-by"

DELIVERY_LIMIT_CLASS = "delivery-limit"
EXCERPT_BYTES = 64
_MASK_LETTERS = re.compile(r"[A-Za-z]")
_MASK_DIGITS = re.compile(r"[0-9]")


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


def header_int(headers: dict[str, Any], name: str, default: int) -> int:
    """An integer header, or ``default`` when missing or garbage."""
    value = headers.get(name)
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    try:
        return int(value) if value is not None else default
    except (TypeError, ValueError):
        return default


def header_text(headers: dict[str, Any], name: str, default: str, limit: int = 200) -> str:
    """A short text header, or ``default``."""
    value = headers.get(name)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return str(value)[:limit] if value not in (None, "") else default


def stable_message_id(message_id: str | None, body: bytes) -> str:
    """The message id, or one derived from the body when the sender set none."""
    if message_id:
        return message_id[:255]
    return "nomid:" + hashlib.sha256(body).hexdigest()[:16]


def mask_excerpt(body: bytes) -> str:
    """A bounded excerpt that shows a body's shape but none of its letters or digits."""
    text = body[:EXCERPT_BYTES].decode("utf-8", "replace")
    masked = _MASK_DIGITS.sub("9", _MASK_LETTERS.sub("x", text))
    suffix = f"... ({len(body)} bytes)" if len(body) > EXCERPT_BYTES else f" ({len(body)} bytes)"
    return masked + suffix


def _ms(value: int) -> datetime:
    return datetime.fromtimestamp(value / 1000, UTC)


def _first_death(headers: dict[str, Any]) -> dict[str, Any]:
    deaths = headers.get("x-death")
    if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict):
        return deaths[0]
    return {}


def build_record(
    headers: dict[str, Any] | None, body: bytes, message_id: str | None, now: datetime
) -> DeadLetterRecord:
    """The record of one dead letter, from its headers and body."""
    headers = headers or {}
    reservation_id, hold_until, excerpt = _identify(body)
    now_ms = round(now.timestamp() * 1000)
    if GIVE_UP_HEADER in headers:
        give_up = header_text(headers, GIVE_UP_HEADER, GiveUp.PERMANENT)
        error_class = header_text(headers, ERROR_CLASS_HEADER, "unexpected")
        reason = header_text(headers, REASON_HEADER, "-")
        attempts = max(1, header_int(headers, ATTEMPT_HEADER, 1))
        worker = header_text(headers, WORKER_HEADER, "-")
        last_ms = header_int(headers, LAST_SEEN_HEADER, now_ms)
    else:  # dead-lettered by the broker: the delivery limit was reached
        death = _first_death(headers)
        give_up = GiveUp.DELIVERY_LIMIT
        error_class = DELIVERY_LIMIT_CLASS
        reason = f"broker dead-lettered it ({header_text(death, 'reason', 'unknown')})"
        attempts = max(
            1, header_int(headers, "x-delivery-count", 0) + 1, header_int(death, "count", 1)
        )
        worker = "broker"
        died = death.get("time")
        last_ms = round(died.timestamp() * 1000) if isinstance(died, datetime) else now_ms
    first_ms = min(last_ms, header_int(headers, FIRST_SEEN_HEADER, last_ms))
    return DeadLetterRecord(
        message_id=stable_message_id(message_id, body),
        reservation_id=reservation_id,
        hold_until=hold_until,
        error_class=error_class,
        give_up=str(give_up),
        reason=reason,
        attempts=attempts,
        first_seen=_ms(first_ms),
        last_seen=_ms(last_ms),
        worker=worker,
        body_excerpt=excerpt,
    )


def _identify(body: bytes) -> tuple[UUID | None, datetime | None, str | None]:
    try:
        command = parse_command(body)
    except PoisonMessage:
        return None, None, mask_excerpt(body)
    return command.reservation_id, command.hold_until, None
