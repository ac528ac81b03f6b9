"""The window an operator names with --since and --until (service/core/windows.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from service.core.windows import NotATime, moment, window

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90m", NOW - timedelta(minutes=90)),
        ("6h", NOW - timedelta(hours=6)),
        ("3d", NOW - timedelta(days=3)),
        ("2w", NOW - timedelta(weeks=2)),
        ("45s", NOW - timedelta(seconds=45)),
        ("2026-12-04", datetime(2026, 12, 4, tzinfo=UTC)),
        ("2026-12-04T15:00", datetime(2026, 12, 4, 15, tzinfo=UTC)),
        ("2026-12-04T15:00:00+01:00", datetime(2026, 12, 4, 14, tzinfo=UTC)),
        (" 2026-12-04 ", datetime(2026, 12, 4, tzinfo=UTC)),
    ],
)
def test_a_time_is_a_date_a_moment_or_how_long_ago(text: str, expected: datetime) -> None:
    found = moment(text, NOW)
    assert found == expected
    assert found.tzinfo == UTC


@pytest.mark.parametrize("text", ["soon", "", "6 h", "-3d", "3y", "2026-13-01", "1" * 41])
def test_anything_else_is_refused_saying_what_a_time_is(text: str) -> None:
    with pytest.raises(NotATime, match="is not a time: give an ISO 8601 date"):
        moment(text, NOW)


def test_a_long_text_is_cut_in_the_refusal() -> None:
    with pytest.raises(NotATime) as refused:
        moment("x" * 5000, NOW)
    assert len(str(refused.value)) < 300


def test_the_window_runs_to_now_unless_told() -> None:
    asked = window("1h", None, NOW)
    assert (asked.since, asked.until) == (NOW - timedelta(hours=1), NOW)
    assert asked.describe() == "from 2026-12-06T11:00:00+00:00 to 2026-12-06T12:00:00+00:00"
    bounded = window("2026-12-01", "2026-12-02", NOW)
    assert bounded.until == datetime(2026, 12, 2, tzinfo=UTC)


@pytest.mark.parametrize(
    ("since", "until", "said"),
    [
        ("1h", "2h", "is not before --until"),
        ("2026-12-06T12:00", None, "is not before --until"),
        ("2027-01-01", "2027-02-01", "is in the future"),
    ],
)
def test_an_empty_or_future_window_is_refused(since: str, until: str | None, said: str) -> None:
    with pytest.raises(NotATime, match=said):
        window(since, until, NOW)
