"""Unit tests for the retry jitter settings: defaults and what they read (their one-line
refusals are in the table of ``test_settings.py``, with every other setting's)."""

from __future__ import annotations

import pytest

from service.settings import load_settings


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
