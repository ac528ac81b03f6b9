"""What retention keeps, makes and drops, given the partitions and the clock: pure.

The audit tables are partitioned by week (Monday 00:00 UTC to the next); a
partition is dropped once all of it is older than the retention, and weeks are
made from the last one's end until the clock plus ``ahead``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

WEEK = timedelta(days=7)

# The partitioned audit tables, each by its `at` column.
AUDIT_TABLES = (
    "reservation_transitions",
    "dead_letter_events",
    "dead_letter_replays",
    "console_logins",
    "expiry_events_sent",
    "webhook_attempts",
    "history_requests",
)


def week_of(moment: datetime) -> datetime:
    """Monday 00:00 UTC of the week ``moment`` falls in."""
    utc = moment.astimezone(UTC)
    return datetime(utc.year, utc.month, utc.day, tzinfo=UTC) - timedelta(days=utc.weekday())


@dataclass(frozen=True)
class Partition:
    """One partition of an audit table: rows with ``low <= at < high``."""

    table: str
    name: str
    low: datetime
    high: datetime


def to_drop(partitions: Iterable[Partition], now: datetime, keep: timedelta) -> list[Partition]:
    """The partitions wholly older than ``now - keep``, oldest first."""
    cutoff = now - keep
    return sorted((p for p in partitions if p.high <= cutoff), key=lambda p: p.low)


def to_make(
    partitions: Iterable[Partition], now: datetime, ahead: timedelta
) -> list[tuple[datetime, datetime]]:
    """The weeks to make for one table: from the end of its newest partition (or this
    week, when it has none) until one covers ``now + ahead``."""
    ends = [p.high for p in partitions]
    low = max(ends) if ends else week_of(now)
    weeks = []
    while low < now + ahead:
        weeks.append((low, low + WEEK))
        low += WEEK
    return weeks
