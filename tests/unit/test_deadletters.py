"""Unit tests for ``service.deadletters`` and ``service/ops/dead_letters.py``: sender-made text
is shown inert, and who may replay."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime

import pytest

from service import deadletters
from service.adapters import postgres
from service.core.errors import UsageError
from service.ops import dead_letters
from service.ops.dead_letters import render_table
from service.settings import Settings


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


@pytest.mark.parametrize(
    ("tty", "yes", "answer", "refused"),
    [
        (False, False, None, "replay --all needs --yes when it is not run at a terminal"),
        (False, True, None, None),
        (True, False, "y", None),
        (True, False, "YES ", None),
        (True, False, "", "not confirmed at the terminal"),
        (True, False, "n", "not confirmed at the terminal"),
    ],
)
async def test_replay_all_is_confirmed_at_a_terminal_or_by_yes(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tty: bool,
    yes: bool,
    answer: str | None,
    refused: str | None,
) -> None:
    """--all shows its list and asks at a terminal (only 'y' or 'yes' goes on); elsewhere
    it needs --yes."""
    asked: list[str] = []

    def fake_input(question: str) -> str:
        asked.append(question)
        assert answer is not None
        return answer

    monkeypatch.setattr(sys.stdin, "isatty", lambda: tty)
    monkeypatch.setattr("builtins.input", fake_input)
    args = argparse.Namespace(all=True, yes=yes)
    actor = postgres.Actor("alice", "root", "host")
    listed = ["would-republish  #7  m-7", "would-republish  #8  m-8", "would-republish  #9  m-9"]
    assert await deadletters.unconfirmed(args, actor, listed, 3) == refused
    question = "replay these 3 dead letter(s) as alice? [y/N] "
    assert asked == ([question] if answer is not None else [])
    assert ("#9  m-9" in capsys.readouterr().out) == (answer is not None)


def test_only_listed_operators_may_replay() -> None:
    """No list refuses everyone; a list refuses anyone not on it."""
    actor = postgres.Actor("mallory", "root", "host")
    assert "nobody may replay" in str(dead_letters.refusal(Settings(), actor))
    allowed = Settings(replay_operators=("alice", "mallory"))
    assert dead_letters.refusal(allowed, actor) is None
    assert "may not replay" in str(
        dead_letters.refusal(Settings(replay_operators=("alice",)), actor)
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["replay", "--all", "--error-class", "", "--operator", "alice"],
        ["replay", "--all", "--give-up", "   ", "--operator", "alice"],
        ["close", "--all", "--error-class", " ", "--text", "x", "--operator", "alice"],
        ["assign", "--all", "--give-up", "", "--text", "x", "--operator", "alice"],
    ],
)
def test_an_empty_group_filter_is_refused_not_shown_as_any(argv: list[str]) -> None:
    """An empty or blank --error-class or --give-up would select nothing while the group
    read "any": it is refused with one line instead."""
    args = deadletters.build_parser().parse_args(argv)
    with pytest.raises(UsageError, match="is empty") as refused:
        deadletters.selection_of(args)
    assert "\n" not in str(refused.value)


async def test_list_refuses_an_empty_error_class_before_reading_anything() -> None:
    """``list --error-class ''`` is refused with one line before the database is opened."""
    args = deadletters.build_parser().parse_args(["list", "--error-class", " "])
    nowhere = Settings(database_url="postgresql://nobody@127.0.0.1:9/none")
    with pytest.raises(UsageError, match="--error-class is empty"):
        await deadletters.list_command(nowhere, args)


@pytest.mark.parametrize(
    "argv",
    [
        ["list", "--limit", "0"],
        ["list", "--limit", "-3"],
        ["replay", "--all", "--limit", "0", "--operator", "alice"],
        ["close", "--all", "--limit", "-1", "--text", "x", "--operator", "alice"],
    ],
)
def test_a_limit_below_one_is_refused(argv: list[str]) -> None:
    """A limit of zero or less would list nothing (or fail in the database, or quietly
    become one): refused by the parser, exit 2."""
    with pytest.raises(SystemExit) as refused:
        deadletters.build_parser().parse_args(argv)
    assert refused.value.code == 2
