"""Unit tests for service.worker.acks: a multiple-ack never covers an unsettled delivery."""

from __future__ import annotations

from service.worker.acks import AckWindow


def window(ready: tuple[int, ...] = (), settled: tuple[int, ...] = (), floor: int = 0) -> AckWindow:
    return AckWindow(floor=floor, ready={tag: f"d{tag}" for tag in ready}, settled=set(settled))


def test_a_contiguous_run_is_one_ack_at_its_top() -> None:
    w = window(ready=(1, 2, 3))
    assert w.take_prefix() == (3, ["d1", "d2", "d3"])
    assert w.floor == 3
    assert w.take_prefix() == (None, [])


def test_a_delivery_still_handled_stops_the_run() -> None:
    w = window(ready=(1, 2, 4, 5))
    assert w.take_prefix() == (2, ["d1", "d2"])
    assert sorted(w.ready) == [4, 5]  # 3 is still being handled: 4 and 5 wait
    w.ready[3] = "d3"
    assert w.take_prefix() == (5, ["d3", "d4", "d5"])


def test_tags_settled_alone_are_passed_but_never_acked_again() -> None:
    # 1 and 3 were acked or nacked alone (a retry copy, a requeue): the multiple-ack
    # names 2, the highest still outstanding, and the floor moves past 3.
    w = window(ready=(2,), settled=(1, 3))
    assert w.take_prefix() == (2, ["d2"])
    assert w.floor == 3
    assert not w.settled


def test_only_settled_tags_move_the_floor_without_an_ack() -> None:
    w = window(settled=(1, 2))
    assert w.take_prefix() == (None, [])
    assert w.floor == 2


def test_stuck_ready_tags_are_acked_alone_and_then_passed() -> None:
    w = window(ready=(3, 2))
    assert w.take_prefix() == (None, [])  # 1 is still being handled
    assert w.take_stuck() == [(2, "d2"), (3, "d3")]
    assert not w.ready
    w.mark_settled(1)
    assert w.take_prefix() == (None, [])
    assert w.floor == 3


def test_a_tag_at_or_below_the_floor_is_ignored() -> None:
    w = window(floor=5)
    w.mark_settled(4)
    assert not w.settled
