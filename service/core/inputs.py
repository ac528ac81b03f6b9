"""Untrusted input made into bounded values: pure, no I/O.

Every header of a delivery, its message id and its body come from whoever can
publish to our exchanges, and our own ``x-expiry-*`` headers are no
exception: anyone with write access can forge them. AMQP field values arrive
as Python values of any of these types: ``int`` of any width and sign,
``bool``, ``float`` (NaN and infinities included), ``Decimal``, ``str``,
``bytes``, ``datetime``, ``dict``, ``list`` and ``None``. Nothing here raises,
whatever it is given, and every result is within its bounds: an attempt count
in ``1..MAX_ATTEMPT``, a time within ``PAST_WINDOW_MS`` before now and
``FUTURE_WINDOW_MS`` after it, text without control characters and no longer
than its limit (so PostgreSQL's ``text`` and a terminal both take it).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

MAX_ATTEMPT = 1000
MAX_DELIVERY_COUNT = 1_000_000
TEXT_LIMIT = 200
MESSAGE_ID_LIMIT = 255
# A time read from a header is believed only within this window around now
# (a dead letter can wait for its record while the database is away; a year
# covers any outage, and a worker's clock ahead of ours by up to a day).
PAST_WINDOW_MS = 366 * 86_400_000
FUTURE_WINDOW_MS = 86_400_000
_INTEGER_TEXT = re.compile(r"[+-]?[0-9]{1,20}")
_INTEGER_BOUND = 10**20  # beyond any epoch millisecond or count we accept
REPLACEMENT = "?"


def headers_of(value: object) -> Mapping[str, Any]:
    """A delivery's headers as a mapping (``{}`` when absent or not a table)."""
    return value if isinstance(value, dict) else {}


def as_int(value: object) -> int | None:
    """An integer from an integer, an integral float or decimal, or decimal digits."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and value.is_integer() else None
    if isinstance(value, Decimal):
        return _decimal_int(value)
    if isinstance(value, bytes | bytearray):
        value = bytes(value[:24]).decode("ascii", "replace")
    if isinstance(value, str) and _INTEGER_TEXT.fullmatch(value.strip()):
        return int(value.strip())
    return None


def _decimal_int(value: Decimal) -> int | None:
    if not value.is_finite() or abs(value) >= _INTEGER_BOUND:
        return None
    return int(value) if value == value.to_integral_value() else None


def bounded_int(value: object, low: int, high: int) -> int | None:
    """``as_int(value)`` when it lies in ``low..high``, else None."""
    number = as_int(value)
    return number if number is not None and low <= number <= high else None


def millis_of(value: object) -> int | None:
    """Epoch milliseconds from an integer or a ``datetime`` (naive means UTC)."""
    if isinstance(value, datetime):
        moment = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        try:
            return round(moment.timestamp() * 1000)
        except (OverflowError, ValueError, OSError):
            return None
    return bounded_int(value, -_INTEGER_BOUND, _INTEGER_BOUND)


def recent_millis(value: object, now_ms: int) -> int | None:
    """Epoch milliseconds within the believable window around ``now_ms``, else None."""
    moment = millis_of(value)
    if moment is None or not now_ms - PAST_WINDOW_MS <= moment <= now_ms + FUTURE_WINDOW_MS:
        return None
    return moment


def clean_text(text: str, limit: int = TEXT_LIMIT) -> str:
    """``text`` cut to ``limit`` characters, each non-printable one replaced.

    Control and format characters (NUL, escape sequences, bidirectional
    overrides), lone surrogates and line breaks all become ``?``.
    """
    text = text[:limit]
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else REPLACEMENT for char in text)


def text_of(value: object, limit: int = TEXT_LIMIT) -> str | None:
    """Clean text from a string, bytes (UTF-8, errors replaced) or an integer; else None."""
    if isinstance(value, bytes | bytearray):
        value = bytes(value[: limit * 4]).decode("utf-8", "replace")
    elif isinstance(value, int) and not isinstance(value, bool):
        value = str(value) if abs(value) < _INTEGER_BOUND else None
    return clean_text(value, limit) if isinstance(value, str) else None


def header_text(
    headers: Mapping[str, Any], name: str, default: str, limit: int = TEXT_LIMIT
) -> str:
    """A short, clean text header, or ``default`` when missing, empty or not text."""
    return text_of(headers.get(name), limit) or default


def message_id_of(message_id: object, body: bytes) -> str:
    """The message id, cleaned, or one derived from the body when there is none.

    Stable: the same message always gives the same id (dead-letter records and
    the crash counter are keyed by it).
    """
    cleaned = text_of(message_id, MESSAGE_ID_LIMIT)
    if cleaned and cleaned.strip():
        return cleaned
    return "nomid:" + hashlib.sha256(body).hexdigest()[:16]


def delivery_count(headers: Mapping[str, Any], *, redelivered: bool) -> int:
    """How many times the broker has returned this delivery before (quorum queues).

    RabbitMQ keeps ``x-delivery-count`` itself once a message was returned; on
    a first delivery the header is the publisher's and is not believed.
    """
    if not redelivered:
        return 0
    count = bounded_int(headers.get("x-delivery-count"), 0, MAX_DELIVERY_COUNT)
    return max(1, count or 0)


def mask_excerpt(body: bytes, limit: int) -> str:
    """A bounded excerpt that shows a body's shape but none of its letters or digits.

    Letters and digits of any script become ``x`` and ``9``; anything
    non-printable becomes ``?``.
    """
    text = body[:limit].decode("utf-8", "replace")
    masked = "".join(
        "9"
        if char.isdigit()
        else "x"
        if char.isalnum()
        else char
        if char.isprintable()
        else REPLACEMENT
        for char in text
    )
    size = f"{len(body)} bytes"
    return f"{masked}... ({size})" if len(body) > limit else f"{masked} ({size})"
