"""A window of time an operator names on a command line (``--since TIME [--until TIME]``
of a backfill or a replay to a queue): pure.

A TIME is an ISO 8601 date or date and time (``2026-12-04``, ``2026-12-04T15:00``,
``2026-12-04T15:00:00+01:00``; without an offset, UTC), or how long ago (``90m``, ``6h``,
``3d``, ``2w``) from ``now``. ``--until`` defaults to ``now``; the window is
``since <= written < until``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

_AGO = re.compile(r"^(\d{1,6})([smhdw])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
TIME_LIMIT = 40  # characters: anything longer is no time


class NotATime(ValueError):
    """Not a time this module reads (the message says what is)."""


@dataclass(frozen=True)
class Window:
    """``since <= t < until``."""

    since: datetime
    until: datetime

    def describe(self) -> str:
        """The window as an operator reads it."""
        return (
            f"from {self.since.isoformat(timespec='seconds')} "
            f"to {self.until.isoformat(timespec='seconds')}"
        )


def moment(text: str, now: datetime) -> datetime:
    """The moment ``text`` names (see the module docstring), in UTC."""
    value = text.strip()
    ago = _AGO.match(value)
    if ago is not None:
        return now - timedelta(seconds=int(ago.group(1)) * _UNIT[ago.group(2)])
    try:
        found = datetime.fromisoformat(value) if len(value) <= TIME_LIMIT else None
    except ValueError:
        found = None
    if found is None:
        raise NotATime(
            f"{value[:TIME_LIMIT]!r} is not a time: give an ISO 8601 date or date and time "
            "(2026-12-04, 2026-12-04T15:00:00+01:00; UTC without an offset) or how long ago "
            "(90m, 6h, 3d, 2w)"
        )
    if found.tzinfo is None:
        found = found.replace(tzinfo=UTC)
    return found.astimezone(UTC)


def window(since: str, until: str | None, now: datetime) -> Window:
    """The window ``--since`` and ``--until`` name (``until``: ``now`` when not given);
    refused when it is empty or lies in the future."""
    start = moment(since, now)
    end = now if until is None else moment(until, now)
    if start >= end:
        raise NotATime(
            f"--since ({start.isoformat(timespec='seconds')}) is not before --until "
            f"({end.isoformat(timespec='seconds')})"
        )
    if start > now:
        raise NotATime(f"--since ({start.isoformat(timespec='seconds')}) is in the future")
    return Window(start, end)
