"""The relays' wake-up: after commits that wrote events, at most one NOTIFY per window,
never failing a delivery (a fake clock and a fake sleep: no waiting)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from service.worker import wakeup as wakeup_module
from service.worker.wakeup import SILENT, Wakeup


class FakeTime:
    """A clock that only the test moves (a sleep waits for it); records each NOTIFY's
    time."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sent: list[float] = []
        self.failing = False

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        until = self.now + seconds
        while self.now < until - 1e-9:
            await asyncio.sleep(0)

    async def advance(self, seconds: float) -> None:
        """Move the clock on, a turn of the event loop after it."""
        self.now += seconds
        await asyncio.sleep(0)

    async def notify(self) -> None:
        began = self.now
        await asyncio.sleep(0)  # a round trip
        if self.failing:
            raise OSError("connection refused")
        self.sent.append(began)


def wakeup(time: FakeTime, window_ms: int = 10) -> Wakeup:
    return Wakeup(time.notify, window_ms=window_ms, clock=time.clock, sleep=time.sleep)


async def settled(woken: Wakeup, time: FakeTime) -> None:
    """Let the clock run until the wake-up has nothing left to send."""
    async with asyncio.timeout(5):
        for _ in range(3):  # what is under way runs at this time first
            await asyncio.sleep(0)
        while not woken.idle:
            await time.advance(0.001)


async def test_a_burst_of_commits_in_one_turn_is_one_notify_sent_at_once() -> None:
    """A thousand commits before the task runs: one NOTIFY, without waiting for a window."""
    time = FakeTime()
    woken = wakeup(time)
    for _ in range(1000):
        woken.written()
    await settled(woken, time)
    assert time.sent == [1000.0]
    assert woken.sent == 1


async def test_commits_during_a_window_share_one_notify_at_its_end() -> None:
    """The first commit after a quiet spell is notified at once; commits within the next
    10 ms share one more NOTIFY, 10 ms after the first."""
    time = FakeTime()
    woken = wakeup(time)
    woken.written()
    await asyncio.sleep(0)
    for _ in range(5):  # while the first NOTIFY is under way and after it
        woken.written()
        await time.advance(0.001)
    await settled(woken, time)
    assert time.sent == [1000.0, pytest.approx(1000.01)]


async def test_a_steady_thousand_commits_a_second_pay_one_notify_per_window() -> None:
    """One commit every millisecond for a second: about 100 NOTIFYs (one per 10 ms
    window), not 1,000; never two within a window."""
    time = FakeTime()
    woken = wakeup(time)
    start = time.now
    while time.now < start + 1.0:
        woken.written()
        await time.advance(0.001)
    await settled(woken, time)
    assert 95 <= len(time.sent) <= 102, len(time.sent)
    gaps = [b - a for a, b in zip(time.sent, time.sent[1:], strict=False)]
    assert min(gaps) >= 0.01 - 1e-9


async def test_commits_a_window_apart_are_each_notified_at_once() -> None:
    """Commits further apart than the window are never held back."""
    time = FakeTime()
    woken = wakeup(time)
    for _ in range(3):
        woken.written()
        await settled(woken, time)
        time.now = round(time.now) + 1.0
    assert time.sent == [1000.0, 1001.0, 1002.0]


async def test_with_no_window_commits_during_a_notify_share_the_next() -> None:
    """EXPIRY_EVENTS_NOTIFY_MS=0: no wait, but one NOTIFY at a time; what the commits
    during it owe is sent once after it."""
    time = FakeTime()
    woken = wakeup(time, window_ms=0)
    woken.written()
    await asyncio.sleep(0)
    for _ in range(10):
        woken.written()
    await settled(woken, time)
    assert len(time.sent) == 2


async def test_a_failing_notify_is_logged_once_and_never_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The database refuses every NOTIFY: the commits go on, one warning says so (not one
    per failure); once a NOTIFY works again, one line says that too."""
    caplog.set_level(logging.INFO)
    time = FakeTime()
    time.failing = True
    woken = wakeup(time)
    for _ in range(5):
        woken.written()
        await settled(woken, time)
        time.now += 1.0
    assert woken.sent == 0
    assert [r.getMessage() for r in caplog.records] == ["events.notify_failed"]
    time.failing = False
    woken.written()
    await settled(woken, time)
    assert woken.sent == 1
    assert [r.getMessage() for r in caplog.records][1:] == ["events.notify_recovered"]


async def test_close_gives_up_a_notify_that_hangs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stop waits for the last NOTIFY only briefly: one that hangs is cancelled."""
    monkeypatch.setattr(wakeup_module, "CLOSE_TIMEOUT_SECONDS", 0.05)
    hung = asyncio.Event()

    async def hanging() -> None:
        hung.set()
        await asyncio.sleep(3600)

    woken = Wakeup(hanging, window_ms=10)
    woken.written()
    await hung.wait()
    async with asyncio.timeout(5):
        await woken.close()
    assert woken.sent == 0


async def test_the_silent_wakeup_wakes_nobody() -> None:
    """The default of a store without relays to wake: nothing happens."""
    SILENT.written()
    await SILENT.close()
