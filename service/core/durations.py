"""Durations for people: ``1.3s``, ``3m 12s``, ``2h 5m``, ``3d 4h``, ``6.9 years``.

Pure. Machine output (``--json``, ``/metrics``) keeps seconds as numbers; only
what a person reads goes through ``human``.
"""

from __future__ import annotations

import math

MINUTE = 60
HOUR = 60 * MINUTE
DAY = 24 * HOUR
YEAR = 365.25 * DAY


def human(seconds: float) -> str:
    """``seconds`` as a person reads it: two units at most, the larger first."""
    if math.isnan(seconds):
        return "-"
    if seconds < 0:
        return "-" + human(-seconds)
    if math.isinf(seconds):
        return "forever"
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < MINUTE:
        return f"{whole}s"
    if whole < HOUR:
        return _two(whole // MINUTE, "m", whole % MINUTE, "s")
    if whole < DAY:
        return _two(whole // HOUR, "h", whole % HOUR // MINUTE, "m")
    if seconds < 90 * DAY:
        return _two(whole // DAY, "d", whole % DAY // HOUR, "h")
    if seconds < YEAR:
        return f"{seconds / DAY:.0f} days"
    return f"{seconds / YEAR:.1f} years"


def _two(big: int, big_unit: str, small: int, small_unit: str) -> str:
    return f"{big}{big_unit} {small}{small_unit}" if small else f"{big}{big_unit}"
