"""Unit tests for service.worker.batcher.settle_items: one outcome per delivery of a batch."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from opentelemetry import trace

from service.adapters.postgres import BatchRow, Expiry
from service.core.domain import Outcome, duplicate_outcome
from service.core.errors import UnknownReservation
from service.worker.batcher import BatchFallback, Item, settle_items


def _item(rid: uuid.UUID) -> Item:
    future = asyncio.get_running_loop().create_future()
    return Item(rid, "m", 1, future, trace.INVALID_SPAN_CONTEXT)


def fut(item: Item) -> asyncio.Future[Expiry]:
    assert item.future is not None
    return item.future


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
    results = [fut(i).exception() or fut(i).result().outcome for i in items]
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
    assert fut(items[0]).result().lag_seconds == 0.5


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
    fut(gone).cancel()
    rows = {
        won: BatchRow(won=True, lag=1.0, status="held", due=True),
        lost: BatchRow(won=False, lag=None, status="consumed", due=True),
    }
    orphans = settle_items([gone, alive, other], rows)
    assert [(item is gone, expiry.outcome) for item, expiry in orphans] == [(True, Outcome.EXPIRED)]
    assert fut(alive).result().outcome is Outcome.ALREADY_DONE  # the win was reported once
    assert fut(other).result().outcome is Outcome.NOT_ELIGIBLE


def test_deliveries_without_a_task_get_their_outcome_by_callback() -> None:
    """The consumer's fast path: outcomes handed to on_result, duplicates included, and
    a callback that raises does not keep its neighbours from theirs."""
    won, consumed = uuid.uuid4(), uuid.uuid4()
    got: list[tuple[str, Outcome | str]] = []

    def callback(name: str, *, fail: bool = False) -> Item:
        def on_result(result: Expiry | BaseException) -> None:
            got.append(
                (
                    name,
                    type(result).__name__ if isinstance(result, BaseException) else result.outcome,
                )
            )
            if fail:
                raise RuntimeError("report failed")

        rid = consumed if name == "consumed" else won
        return Item(rid, name, 1, None, trace.INVALID_SPAN_CONTEXT, on_result=on_result)

    items = [callback("first", fail=True), callback("again"), callback("consumed")]
    rows = {
        won: BatchRow(won=True, lag=0.1, status="held", due=True),
        consumed: BatchRow(won=False, lag=None, status="consumed", due=True),
    }
    assert settle_items(items, rows) == []
    assert got == [
        ("first", Outcome.EXPIRED),
        ("again", Outcome.ALREADY_DONE),
        ("consumed", Outcome.NOT_ELIGIBLE),
    ]
    settle_items(items, rows)  # given once: a second settling changes nothing
    assert len(got) == 3
