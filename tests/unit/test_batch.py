"""Unit tests for service.batch.settle_items: one outcome per delivery of a batch."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from opentelemetry import trace

from service.batch import BatchFallback, Item, settle_items
from service.db import BatchRow
from service.domain import Outcome, duplicate_outcome
from service.errors import UnknownReservation


def _item(rid: uuid.UUID) -> Item:
    future = asyncio.get_running_loop().create_future()
    return Item(rid, "m", 1, future, trace.INVALID_SPAN_CONTEXT)


async def test_each_delivery_gets_its_own_outcome() -> None:
    """Winners expire, duplicates are already done, unknown and ambiguous ones stand alone."""
    won, dup, consumed, unknown, ambiguous, missing = (uuid.uuid4() for _ in range(6))
    items = [_item(r) for r in (won, dup, dup, consumed, unknown, ambiguous, missing, won)]
    rows = {
        won: BatchRow(won=True, lag=0.5, status="held", due=True),
        dup: BatchRow(won=False, lag=None, status="expired", due=True),
        consumed: BatchRow(won=False, lag=None, status="consumed", due=True),
        unknown: BatchRow(won=False, lag=None, status=None, due=False),
        ambiguous: BatchRow(won=False, lag=None, status="held", due=True),
    }
    settle_items(items, rows)
    results = [i.future.exception() or i.future.result().outcome for i in items]
    assert results[:4] == [
        Outcome.EXPIRED,
        Outcome.ALREADY_DONE,
        Outcome.ALREADY_DONE,
        Outcome.NOT_ELIGIBLE,
    ]
    assert isinstance(results[4], UnknownReservation)
    assert isinstance(results[5], BatchFallback)  # held and due but lost: decide it alone
    assert isinstance(results[6], BatchFallback)  # no row at all: decide it alone
    assert results[7] == Outcome.ALREADY_DONE  # the second copy of the winner
    assert items[0].future.result().lag_seconds == 0.5


@pytest.mark.parametrize(
    ("first", "then"),
    [
        (Outcome.EXPIRED, Outcome.ALREADY_DONE),
        (Outcome.ALREADY_DONE, Outcome.ALREADY_DONE),
        (Outcome.NOT_ELIGIBLE, Outcome.NOT_ELIGIBLE),
    ],
)
def test_duplicate_outcome_is_what_sequential_handling_gives(first: Outcome, then: Outcome) -> None:
    """A later copy in the same batch sees what the first copy left."""
    assert duplicate_outcome(first) is then


async def test_a_win_nobody_waits_for_is_still_reported() -> None:
    """A delivery cancelled with its channel, whose batch then committed, is an orphan."""
    won, lost = uuid.uuid4(), uuid.uuid4()
    gone, alive, other = _item(won), _item(won), _item(lost)
    gone.future.cancel()
    rows = {
        won: BatchRow(won=True, lag=1.0, status="held", due=True),
        lost: BatchRow(won=False, lag=None, status="consumed", due=True),
    }
    orphans = settle_items([gone, alive, other], rows)
    assert [(item is gone, expiry.outcome) for item, expiry in orphans] == [(True, Outcome.EXPIRED)]
    assert alive.future.result().outcome is Outcome.ALREADY_DONE  # the win was reported once
    assert other.future.result().outcome is Outcome.NOT_ELIGIBLE
