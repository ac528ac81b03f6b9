"""Durations for people (``service/core/durations.py``)."""

from __future__ import annotations

import math

import pytest

from service.core.durations import human


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0, "0.0s"),
        (1.34, "1.3s"),
        (9.99, "10.0s"),
        (10, "10s"),
        (59.9, "59s"),
        (60, "1m"),
        (192, "3m 12s"),
        (3600, "1h"),
        (7500, "2h 5m"),
        (86400, "1d"),
        (3 * 86400 + 4 * 3600 + 59, "3d 4h"),
        (120 * 86400, "120 days"),
        (218393913.1, "6.9 years"),
        (-192, "-3m 12s"),
        (math.inf, "forever"),
        (math.nan, "-"),
    ],
)
def test_a_duration_reads_in_at_most_two_units(seconds: float, shown: str) -> None:
    """Seconds become the one or two largest units that say them."""
    assert human(seconds) == shown
