"""Which weeks retention makes and drops, given the partitions and the clock (pure)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from service.core.weeks import (
    WEEK,
    Partition,
    to_drop,
    to_make,
    week_of,
)

MONDAY = datetime(2026, 11, 30, tzinfo=UTC)


def _weeks(first: datetime, count: int) -> list[Partition]:
    return [
        Partition("t", f"t_w{first + n * WEEK:%Y%m%d}", first + n * WEEK, first + (n + 1) * WEEK)
        for n in range(count)
    ]


def test_a_week_begins_on_monday_at_midnight_utc_whatever_the_offset() -> None:
    assert week_of(MONDAY) == MONDAY
    assert week_of(MONDAY + timedelta(days=6, hours=23, minutes=59)) == MONDAY
    assert week_of(MONDAY + WEEK) == MONDAY + WEEK
    tokyo = datetime(2026, 12, 7, 8, 0, tzinfo=UTC).astimezone(ZoneInfo("Asia/Tokyo"))
    assert week_of(tokyo) == MONDAY + WEEK
    assert week_of(MONDAY - timedelta(microseconds=1)) == MONDAY - WEEK


def test_only_weeks_wholly_past_the_retention_are_dropped_oldest_first() -> None:
    weeks = _weeks(MONDAY - 20 * WEEK, 24)
    now = MONDAY + timedelta(days=2)
    keep = timedelta(days=90)
    dropped = to_drop(reversed(weeks), now, keep)
    assert [p.low for p in dropped] == sorted(p.low for p in dropped)
    assert all(p.high <= now - keep for p in dropped)
    kept = [p for p in weeks if p not in dropped]
    assert min(p.low for p in kept) <= now - keep < min(p.high for p in kept)
    assert to_drop(weeks, now, timedelta(days=36500)) == []


def test_weeks_are_made_from_the_last_one_until_the_clock_plus_ahead() -> None:
    now = MONDAY + timedelta(days=3)
    made = to_make(_weeks(MONDAY, 2), now, timedelta(days=28))
    assert made[0] == (MONDAY + 2 * WEEK, MONDAY + 3 * WEEK)
    assert made[-1][0] < now + timedelta(days=28) <= made[-1][1]
    assert all(high - low == WEEK for low, high in made)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(made))


def test_a_table_without_partitions_starts_this_week_and_a_late_run_fills_the_gap() -> None:
    now = MONDAY + timedelta(days=3)
    assert to_make([], now, timedelta(days=14))[0] == (MONDAY, MONDAY + WEEK)
    stale = _weeks(MONDAY - 6 * WEEK, 2)  # ends four weeks ago: the timer stopped
    made = to_make(stale, now, timedelta(days=14))
    assert made[0][0] == MONDAY - 4 * WEEK  # no gap: from the end of the last one
    assert to_make(_weeks(MONDAY, 10), now, timedelta(days=14)) == []
