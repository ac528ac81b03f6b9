"""Unit tests for the retry jitter settings: defaults, what they read, one-line refusals."""

from __future__ import annotations

import pytest

from service.settings import load_settings
from tests.recipes import assert_refused_in_one_line


def test_jitter_is_on_by_default_over_eight_slots() -> None:
    """With nothing set, retries spread over the last half of each tier, eight slots."""
    settings = load_settings()
    assert (settings.retry_jitter, settings.retry_jitter_slots) == (0.5, 8)


@pytest.mark.parametrize(
    ("jitter", "slots", "expected"),
    [("0", "2", (0.0, 2)), ("0.25", "32", (0.25, 32)), ("0.999", "8", (0.999, 8))],
)
def test_jitter_settings_are_read(
    monkeypatch: pytest.MonkeyPatch, jitter: str, slots: str, expected: tuple[float, int]
) -> None:
    """EXPIRY_RETRY_JITTER and EXPIRY_RETRY_JITTER_SLOTS, at the ends of their ranges too."""
    monkeypatch.setenv("EXPIRY_RETRY_JITTER", jitter)
    monkeypatch.setenv("EXPIRY_RETRY_JITTER_SLOTS", slots)
    settings = load_settings()
    assert (settings.retry_jitter, settings.retry_jitter_slots) == expected


JITTER_RANGE = "EXPIRY_RETRY_JITTER: must be a fraction >= 0 and < 1"
SLOTS_RANGE = "EXPIRY_RETRY_JITTER_SLOTS: must be a whole number from 2 to 32"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("EXPIRY_RETRY_JITTER", "1", JITTER_RANGE),
        ("EXPIRY_RETRY_JITTER", "1.5", JITTER_RANGE),
        ("EXPIRY_RETRY_JITTER", "-0.1", JITTER_RANGE),
        ("EXPIRY_RETRY_JITTER", "nan", JITTER_RANGE),
        ("EXPIRY_RETRY_JITTER", "inf", JITTER_RANGE),
        ("EXPIRY_RETRY_JITTER", "half", "EXPIRY_RETRY_JITTER: Input should be a valid number"),
        ("EXPIRY_RETRY_JITTER_SLOTS", "1", SLOTS_RANGE),
        ("EXPIRY_RETRY_JITTER_SLOTS", "0", SLOTS_RANGE),
        ("EXPIRY_RETRY_JITTER_SLOTS", "33", SLOTS_RANGE),
        ("EXPIRY_RETRY_JITTER_SLOTS", "2.5", "EXPIRY_RETRY_JITTER_SLOTS: Input should be a valid"),
        ("EXPIRY_RETRY_JITTER_SLOTS", "many", "EXPIRY_RETRY_JITTER_SLOTS: Input should be a valid"),
    ],
)
def test_bad_jitter_settings_are_refused_with_one_line(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    """A bad value becomes one ConfigError line that starts with the setting's name."""
    assert_refused_in_one_line(monkeypatch, name, value, message)
