"""Unit tests for what service.deadletters prints: sender-made text is shown inert."""

from __future__ import annotations

from datetime import UTC, datetime

from service.deadletters import render_table


def test_control_characters_never_reach_the_terminal() -> None:
    """Escape sequences, NUL, line breaks and bidi overrides in a record are shown as '?'."""
    rows = [
        {
            "id": 1,
            "last_seen": datetime(2026, 12, 1, tzinfo=UTC),
            "message_id": "evil\x1b[2J\x1b]0;title\x07\x00\u202e\nnext",
            "reason": "\x9b31m",
        }
    ]
    table = render_table(rows, ("id", "last_seen", "message_id", "reason"))
    assert all(line.isprintable() for line in table.splitlines())
    assert len(table.splitlines()) == 2
    assert "evil?[2J?]0;title????next" in table
    assert "2026-12-01T00:00:00+00:00" in table
