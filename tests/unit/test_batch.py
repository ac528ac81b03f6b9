"""Unit tests for service.worker.batcher.settle_items: one outcome per delivery of a batch."""

from __future__ import annotations

import uuid

import pytest

from service.core.domain import BatchRow, Expiry, Outcome, duplicate_outcome
from service.core.errors import UnknownReservation
from service.worker.batcher import BatchFallback, Item, settle_items


class Outcomes:
    """Collects what each item was given."""

    def __init__(self) -> None:
        self.given: dict[int, list[Expiry | BaseException]] = {}

    def item(self, rid: uuid.UUID) -> Item:
        key = len(self.given)
        self.given[key] = []
        return Item(rid, "m", 1, self.given[key].append)

    def of(self, index: int) -> Expiry | BaseException:
        [result] = self.given[index]
        return result


def test_each_delivery_gets_its_own_outcome() -> None:
    """Winners expire, duplicates are already done, unknown and ambiguous ones stand alone."""
    won, dup, consumed, unknown, ambiguous, missing = (uuid.uuid4() for _ in range(6))
    outcomes = Outcomes()
    items = [outcomes.item(r) for r in (won, dup, dup, consumed, unknown, ambiguous, missing, won)]
    rows = {
        won: BatchRow(won=True, lag=0.5, status="held", due=True),
        dup: BatchRow(won=False, lag=None, status="expired", due=True),
        consumed: BatchRow(won=False, lag=None, status="consumed", due=True),
        unknown: BatchRow(won=False, lag=None, status=None, due=False),
        ambiguous: BatchRow(won=False, lag=None, status="held", due=True),
    }
    settle_items(items, rows)
    given = [outcomes.of(index) for index in range(len(items))]
    results = [r if isinstance(r, BaseException) else r.outcome for r in given]
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
    first = given[0]
    assert isinstance(first, Expiry)
    assert first.lag_seconds == 0.5


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


def test_a_callback_that_raises_keeps_no_neighbour_from_its_outcome() -> None:
    """Outcomes are handed to each item's callback once, duplicates included, and a
    callback that raises does not keep its neighbours from theirs."""
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
        return Item(rid, name, 1, on_result)

    items = [callback("first", fail=True), callback("again"), callback("consumed")]
    rows = {
        won: BatchRow(won=True, lag=0.1, status="held", due=True),
        consumed: BatchRow(won=False, lag=None, status="consumed", due=True),
    }
    settle_items(items, rows)
    assert got == [
        ("first", Outcome.EXPIRED),
        ("again", Outcome.ALREADY_DONE),
        ("consumed", Outcome.NOT_ELIGIBLE),
    ]
    settle_items(items, rows)  # given once: a second settling changes nothing
    assert len(got) == 3
