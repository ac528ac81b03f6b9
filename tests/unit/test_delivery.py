"""Unit tests for service.worker.delivery (what a delivery says of itself), and settle."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import pytest
from aiormq.exceptions import ChannelInvalidStateError

from service.adapters.amqp.connection import settle
from service.core.dead_letter import build_record
from service.core.errors import PoisonMessage
from service.worker.delivery import NEXT, Delivery, Stage, read_attempt, short_reason


class FakeMessage:
    """Just the attributes read_attempt looks at."""

    def __init__(
        self, headers: dict[str, Any] | None, message_id: str | None = "m", body: bytes = b"{}"
    ) -> None:
        self.headers = headers
        self.message_id = message_id
        self.body = body


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        (None, (1, 5000)),
        ({}, (1, 5000)),
        ({"x-expiry-attempt": 3, "x-expiry-first-seen": 1000}, (3, 1000)),
        ({"x-expiry-attempt": b"4"}, (4, 5000)),
        ({"x-expiry-attempt": "junk", "x-expiry-first-seen": "junk"}, (1, 5000)),
        ({"x-expiry-attempt": -7}, (1, 5000)),
        ({"x-expiry-first-seen": 9999999}, (1, 5000)),  # from the future: clamp to now
    ],
)
def test_read_attempt_trusts_nothing(
    headers: dict[str, Any] | None, expected: tuple[int, int]
) -> None:
    """Missing or garbage headers fall back to attempt 1, first seen now."""
    attempt = read_attempt(FakeMessage(headers), now_ms=5000)  # type: ignore[arg-type]
    assert (attempt.number, attempt.first_seen_ms) == expected


@pytest.mark.parametrize("message_id", [None, "", "   "])
def test_a_delivery_without_a_message_id_is_named_as_its_dead_letter_record_names_it(
    message_id: str | None,
) -> None:
    """The id the consumer logs for a message without one is the record's (derived from
    the body), never "-": the log line and the dead-letter record can be matched."""
    body = b"not json"
    attempt = read_attempt(FakeMessage(None, message_id, body), now_ms=5000)  # type: ignore[arg-type]
    record = build_record(None, body, message_id, datetime.now(UTC))
    assert attempt.message_id == record.message_id
    assert attempt.message_id.startswith("nomid:")


def test_short_reason_keeps_our_words_and_only_the_type_of_others() -> None:
    """Library error texts may quote data; only their type (and sqlstate) is kept."""
    assert short_reason(PoisonMessage("poison.schema", "hold_until: bad")) == "hold_until: bad"
    assert short_reason(ValueError("customer said: call me at 555")) == "ValueError"


async def test_settle_never_acks_on_a_replaced_channel(caplog: pytest.LogCaptureFixture) -> None:
    """An ack whose channel is gone is skipped and logged; the broker redelivers."""
    caplog.set_level(logging.INFO)

    async def ack_on_closed_channel() -> None:
        raise ChannelInvalidStateError("closed")

    acked = await settle(ack_on_closed_channel, "m-1")
    assert acked is False
    assert [r.msg for r in caplog.records] == ["expiry.stale_delivery"]


async def test_settle_reports_success() -> None:
    """A normal ack returns True."""
    calls: list[str] = []

    async def ack() -> None:
        calls.append("ack")

    assert await settle(ack, "m-1") is True
    assert calls == ["ack"]


def _delivery() -> Delivery:
    message = FakeMessage(None)
    return Delivery(message, read_attempt(message, now_ms=5000), started=0.0)  # type: ignore[arg-type]


def test_a_delivery_moves_only_forward_and_ends_once() -> None:
    """Handling, then settling (again, for a retry's copy and its reject) or acking, then
    ended once; nothing after the end, and no settling once an ack is under way."""
    retried = _delivery()
    assert (retried.stage, retried.settled) == (Stage.HANDLING, False)
    retried.settling()
    retried.settling()
    assert (retried.settled, retried.ack_under_way) == (True, False)
    assert retried.end() is True
    assert retried.end() is False
    assert retried.settled
    with pytest.raises(RuntimeError, match="from ENDED to SETTLING"):
        retried.settling()

    acked = _delivery()
    acked.acking()
    assert (acked.settled, acked.ack_under_way) == (True, True)
    with pytest.raises(RuntimeError, match="from ACKING to SETTLING"):
        acked.settling()
    assert acked.end() is True
    assert (acked.stage, acked.ack_under_way) == (Stage.ENDED, False)

    stopped = _delivery()  # ended unsettled: given back to the broker at a stop
    assert stopped.end() is True
    assert stopped.stage is Stage.ENDED


def test_every_stage_has_its_next_stages() -> None:
    assert set(NEXT) == set(Stage)
    assert NEXT[Stage.ENDED] == set()
