"""Property tests: every function that reads a header, a message id or a body.

Headers are drawn from every AMQP field type as aiormq hands them over
(integers of every width and sign, booleans, floats with NaN and infinities,
decimals, text with control characters and lone surrogates, bytes, naive and
aware datetimes, nested tables and arrays, nulls), for our own header names
and any other; bodies are any bytes. No reader may raise, and every result
must lie within its bounds.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, cast

import pytest
from aio_pika.abc import AbstractIncomingMessage
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import context as otel_context
from opentelemetry.propagate import get_global_textmap
from pamqp import encode

from service.adapters.amqp import wire
from service.adapters.telemetry.propagation import SafePropagator
from service.core import dead_letter, inputs
from service.core.domain import ExpireCommand, parse_command
from service.core.errors import PoisonMessage
from service.worker.delivery import read_attempt

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
NOW_MS = round(NOW.timestamp() * 1000)

OUR_HEADERS = [
    dead_letter.ATTEMPT_HEADER,
    dead_letter.FIRST_SEEN_HEADER,
    dead_letter.LAST_SEEN_HEADER,
    dead_letter.ERROR_CLASS_HEADER,
    dead_letter.REASON_HEADER,
    dead_letter.GIVE_UP_HEADER,
    dead_letter.WORKER_HEADER,
    "x-delivery-count",
    "x-death",
    "traceparent",
    "tracestate",
    "baggage",
]

INTEGERS = st.one_of(
    *(
        st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) | st.integers(0, 2**bits - 1)
        for bits in (8, 16, 32, 64)
    ),
    st.integers(),
    st.sampled_from([0, -1, 1, 2**62, 4611686018427387904, -1000000000000000, NOW_MS]),
)
ZONES = st.builds(
    timezone,
    st.timedeltas(
        min_value=-timedelta(hours=23, minutes=59), max_value=timedelta(hours=23, minutes=59)
    ),
)
TEXTS = st.one_of(
    st.text(),
    st.text(st.characters(min_codepoint=0, max_codepoint=0x1F)),  # control characters
    st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)),  # lone surrogates
    st.text(max_size=5000),
    st.sampled_from(["\x00", "\x1b[2J\x1b[31mred", "\u202eevil", "12", " 42 ", "9" * 30]),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    INTEGERS,
    st.floats(allow_nan=True, allow_infinity=True),
    st.decimals(allow_nan=True, allow_infinity=True),
    TEXTS,
    st.binary(max_size=2000),
    st.datetimes(timezones=st.none() | ZONES | st.just(UTC)),
)
FIELDS = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=20), children, max_size=4)
    ),
    max_leaves=12,
)
DEATHS = st.lists(
    st.dictionaries(st.sampled_from(["reason", "time", "count", "queue", "exchange"]), FIELDS),
    max_size=3,
)
HEADERS = st.one_of(
    st.none(),
    FIELDS,  # not even a table
    st.dictionaries(
        st.sampled_from(OUR_HEADERS) | st.text(max_size=30),
        FIELDS,
        max_size=10,
    ),
    st.fixed_dictionaries({"x-death": DEATHS}, optional={"x-delivery-count": FIELDS}),
    st.fixed_dictionaries(
        {dead_letter.GIVE_UP_HEADER: FIELDS},
        optional={name: FIELDS for name in OUR_HEADERS if name != dead_letter.GIVE_UP_HEADER},
    ),
)
BODIES = st.one_of(
    st.binary(max_size=4000),
    st.builds(
        lambda rid, when: (
            f'{{"reservation_id":"{rid}","hold_until":"{when.isoformat()}"}}'.encode()
        ),
        st.uuids(),
        st.datetimes(timezones=ZONES),
    ),
    st.sampled_from([b"\x00", b'{"reservation_id": "\x00"}', b"\xff\xfe", b"[" * 5000]),
)
MESSAGE_IDS = st.one_of(st.none(), TEXTS, st.text(max_size=300))


def _clean(text: str, limit: int) -> bool:
    return len(text) <= limit and text.isprintable()


@dataclass
class FakeMessage:
    """What read_attempt reads of a delivery."""

    headers: Any
    message_id: Any
    body: bytes = b""
    redelivered: bool = False


@settings(max_examples=500)
@given(value=FIELDS)
def test_integer_readers_stay_within_bounds(value: object) -> None:
    """An integer read from any field value is an int within the asked bounds, or None."""
    bounded = inputs.bounded_int(value, 1, inputs.MAX_ATTEMPT)
    assert bounded is None or (type(bounded) is int and 1 <= bounded <= inputs.MAX_ATTEMPT)
    number = inputs.as_int(value)
    assert number is None or type(number) is int
    moment = inputs.recent_millis(value, NOW_MS)
    assert moment is None or (
        NOW_MS - inputs.PAST_WINDOW_MS <= moment <= NOW_MS + inputs.FUTURE_WINDOW_MS
    )
    millis = inputs.millis_of(value)
    assert millis is None or type(millis) is int


@settings(max_examples=500)
@given(value=FIELDS, limit=st.integers(1, 300))
def test_text_readers_give_short_printable_text(value: object, limit: int) -> None:
    """Text read from any field value is printable (no NUL, escape, surrogate) and short."""
    text = inputs.text_of(value, limit)
    assert text is None or _clean(text, limit)
    if text is not None:
        text.encode("utf-8")  # PostgreSQL's text takes it
    assert _clean(inputs.header_text({"h": value}, "h", "-", limit), max(limit, 1))


@settings(max_examples=500)
@given(message_id=MESSAGE_IDS, body=BODIES)
def test_message_ids_are_clean_stable_and_never_empty(message_id: object, body: bytes) -> None:
    """A message id is printable, at most 255 characters, non-empty and the same each time."""
    first = inputs.message_id_of(message_id, body)
    assert first == dead_letter.stable_message_id(message_id, body)
    assert _clean(first, inputs.MESSAGE_ID_LIMIT)
    assert first.strip()


@settings(max_examples=500)
@given(headers=HEADERS, redelivered=st.booleans())
def test_delivery_count_is_bounded_and_believed_only_on_redelivery(
    headers: object, redelivered: bool
) -> None:
    """The broker's count is a small non-negative integer, zero on a first delivery."""
    count = inputs.delivery_count(inputs.headers_of(headers), redelivered=redelivered)
    assert 0 <= count <= inputs.MAX_DELIVERY_COUNT
    assert count == 0 or redelivered


@settings(max_examples=500)
@given(headers=HEADERS, message_id=MESSAGE_IDS, body=BODIES)
def test_read_attempt_never_raises_and_stays_in_bounds(
    headers: object, message_id: object, body: bytes
) -> None:
    """The consumer's reading of our headers gives a bounded attempt and first-seen time."""
    message = cast(AbstractIncomingMessage, FakeMessage(headers, message_id, body))
    attempt = read_attempt(message, NOW_MS)
    assert 1 <= attempt.number <= inputs.MAX_ATTEMPT
    assert NOW_MS - inputs.PAST_WINDOW_MS <= attempt.first_seen_ms <= NOW_MS
    assert _clean(attempt.message_id, inputs.MESSAGE_ID_LIMIT)


def _storable(record: dead_letter.DeadLetterRecord) -> None:
    """Every field fits its column: clean bounded text, bounded numbers and times."""
    for text, limit in (
        (record.message_id, inputs.MESSAGE_ID_LIMIT),
        (record.error_class, dead_letter.NAME_LIMIT),
        (record.give_up, dead_letter.NAME_LIMIT),
        (record.reason, inputs.TEXT_LIMIT),
        (record.worker, inputs.TEXT_LIMIT),
    ):
        assert text, limit
        assert _clean(text, limit), (text, limit)
    if record.body_excerpt is not None:
        assert record.body_excerpt.isprintable()
        assert len(record.body_excerpt) <= dead_letter.EXCERPT_BYTES + 40
    assert 1 <= record.attempts <= inputs.MAX_ATTEMPT
    window = timedelta(milliseconds=inputs.PAST_WINDOW_MS)
    ahead = timedelta(milliseconds=inputs.FUTURE_WINDOW_MS)
    assert NOW - window <= record.first_seen <= record.last_seen <= NOW + ahead
    if record.hold_until is not None:
        assert record.hold_until.utcoffset() == timedelta(0)


@settings(max_examples=1000)
@given(headers=HEADERS, body=BODIES, message_id=MESSAGE_IDS)
def test_any_dead_letter_gives_a_storable_record(
    headers: object, body: bytes, message_id: object
) -> None:
    """build_record never raises, and what it builds (and its reduced form) fits the table."""
    record = dead_letter.build_record(headers, body, message_id, NOW)
    _storable(record)
    reduced = dead_letter.reduced_record(record, "CharacterNotInRepertoireError")
    _storable(reduced)
    assert reduced.reservation_id is None
    assert reduced.body_excerpt is None
    assert reduced.reason.startswith("record reduced")
    _storable(dead_letter.unreadable_record(message_id, body, NOW, "ValueError"))


@settings(max_examples=500)
@given(body=BODIES)
def test_excerpts_show_no_letters_or_digits_of_any_script(body: bytes) -> None:
    """The masked excerpt of a body keeps its shape but no letter or digit, and no control."""
    excerpt = inputs.mask_excerpt(body, dead_letter.EXCERPT_BYTES)
    shown = excerpt.rsplit(" (", 1)[0].removesuffix("...")
    assert not any(char.isalnum() and char not in "x9" for char in shown)
    assert excerpt.isprintable()


@settings(max_examples=500)
@given(body=BODIES)
def test_parse_command_raises_only_poison(body: bytes) -> None:
    """Any body parses into a command or raises PoisonMessage, nothing else."""
    try:
        command = parse_command(body)
    except PoisonMessage as exc:
        error_class = exc.error_class
    else:
        assert isinstance(command, ExpireCommand)
        return
    assert error_class.startswith("poison.")


@settings(max_examples=500)
@given(headers=HEADERS)
def test_trace_context_extraction_never_raises(headers: object) -> None:
    """Forged trace headers give no parent context, never an exception."""
    propagator = SafePropagator(get_global_textmap())
    assert isinstance(propagator.extract(headers), otel_context.Context)


def test_the_issue_headers_are_read_as_absent() -> None:
    """An attempt of 2**62 and a first-seen 31,000 years ago count as not given."""
    message = cast(
        AbstractIncomingMessage,
        FakeMessage(
            {"x-expiry-attempt": 4611686018427387904, "x-expiry-first-seen": -1000000000000000},
            "expire:x",
        ),
    )
    attempt = read_attempt(message, NOW_MS)
    assert (attempt.number, attempt.first_seen_ms) == (1, NOW_MS)
    record = dead_letter.build_record(
        {
            dead_letter.GIVE_UP_HEADER: "attempts-exhausted",
            dead_letter.ATTEMPT_HEADER: 4611686018427387904,
            dead_letter.FIRST_SEEN_HEADER: -1000000000000000,
            dead_letter.LAST_SEEN_HEADER: 2**63,
        },
        b"\x00poison",
        "expire:\x00x",
        NOW,
    )
    assert (record.attempts, record.first_seen, record.last_seen) == (1, NOW, NOW)
    assert record.message_id == "expire:?x"
    assert record.body_excerpt == "?xxxxxx (7 bytes)"


# -- the wire: frames a hostile publisher can send ------------------------------------


@settings(max_examples=300)
@given(raw=st.binary(min_size=8, max_size=8))
def test_any_timestamp_on_the_wire_decodes(raw: bytes) -> None:
    """Every 64-bit timestamp decodes to a datetime (the year 9999 at most)."""
    consumed, value = wire.timestamp(raw)
    assert consumed == 8
    assert isinstance(value, datetime)


@settings(max_examples=300)
@given(raw=st.binary(max_size=255))
def test_any_short_string_on_the_wire_decodes(raw: bytes) -> None:
    """Every short string decodes to text, undecodable bytes replaced."""
    consumed, value = wire.short_str(bytes([len(raw)]) + raw)
    assert consumed == len(raw) + 1
    assert isinstance(value, str)


@settings(max_examples=300)
@given(key=st.binary(min_size=1, max_size=255), value=st.integers(-(2**31), 2**31 - 1))
def test_any_header_name_on_the_wire_decodes(key: bytes, value: int) -> None:
    """A table whose header name is any bytes decodes; its value is kept."""
    placeholder = "k" * len(key)
    encoded = encode.field_table({placeholder: value})
    spoiled = encoded.replace(placeholder.encode(), key, 1)
    consumed, table = wire.field_table(spoiled)
    assert consumed == len(spoiled)
    assert list(table.values()) == [value]


def test_truncated_frames_stay_errors() -> None:
    """A truncated timestamp or table is still refused (a broken frame, not a hostile value)."""
    with pytest.raises(ValueError, match="unpack"):
        wire.timestamp(b"\x00\x01")
    with pytest.raises(ValueError, match="exceeds"):
        wire.field_table(struct.pack(">I", 100) + b"\x01k")


def test_install_makes_pamqp_decode_hostile_values() -> None:
    """After install, pamqp's own table decoding takes a far timestamp and a bad name."""
    from pamqp import decode

    wire.install()
    stamp = encode.field_table({"t": datetime(2020, 1, 1, tzinfo=UTC)})
    when = struct.pack(">Q", int(datetime(2020, 1, 1, tzinfo=UTC).timestamp()))
    far = stamp.replace(when, struct.pack(">Q", 2**64 - 1))
    assert decode.by_type(far, "table")[1] == {"t": wire.FAR_FUTURE}
    named = encode.field_table({"kk": Decimal(1)}).replace(b"kk", b"\xff\xfe")
    assert decode.by_type(named, "table")[1] == {"\ufffd\ufffd": Decimal(1)}
