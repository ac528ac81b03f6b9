"""Unit tests for ``service/ops``: what status, verify and the dead-letter operations show."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from service.adapters.metrics import Backlog
from service.core.errors import UsageError
from service.ops import dead_letters, replay
from service.ops.status import QueueState, Status, as_json, describe, render
from service.ops.verification import Verdict


def _status(**overrides: Any) -> Status:
    values: dict[str, Any] = {
        "at": "2026-01-01T00:00:00+00:00",
        "objective_seconds": 120.0,
        "backlog": Backlog(5.0, {"<1m": 2, "1-5m": 1}),
        "dead_letters_by_class": {},
    }
    values.update(overrides)
    return Status(**values)


@pytest.mark.parametrize(
    ("oldest", "broker_error", "code"),
    [(5.0, None, 0), (500.0, None, 3), (5.0, "ConnectionError: x", 1), (500.0, "E", 1)],
)
def test_the_status_exit_code_puts_an_unreachable_broker_first(
    oldest: float, broker_error: str | None, code: int
) -> None:
    """1 when the broker could not be read, else 3 when the objective is missed, else 0."""
    status = _status(backlog=Backlog(oldest, {}), broker_error=broker_error)
    assert status.exit_code == code


def test_the_status_screen_names_missing_queues_and_an_unreachable_broker() -> None:
    """A queue that does not exist shows as missing; the broker's error has its own line."""
    status = _status(
        queues=[QueueState("expirations", 3, 2), QueueState("expirations.dead", None, None)],
        broker_error="ConnectionError: refused",
        dead_letters_by_class={"poison.not-json": 4},
    )
    lines = render(status).splitlines()
    assert "oldest due hold         5.0s   OK" in lines
    assert "due backlog               3    <1m: 2, 1-5m: 1" in lines
    assert "broker unreachable: ConnectionError: refused" in lines
    assert any(line.split() == ["expirations", "3", "2"] for line in lines)
    assert any(line.split() == ["expirations.dead", "missing", "-"] for line in lines)
    assert lines[-1].split() == ["poison.not-json", "4"]


def test_the_status_json_holds_the_total_and_the_verdict() -> None:
    """The machine form adds the backlog's total and whether the objective is met."""
    data = as_json(_status(backlog=Backlog(500.0, {"<1m": 2})))
    assert data["backlog"] == {"oldest_due_age_seconds": 500.0, "by_bucket": {"<1m": 2}, "total": 2}
    assert data["objective_met"] is False
    assert data["broker_error"] is None


def test_a_broker_error_is_described_without_its_password() -> None:
    """``Type: message``, with any URL password redacted."""
    described = describe(ConnectionError("cannot reach amqp://u:hunter2@h:5672/"))
    assert described.startswith("ConnectionError: cannot reach amqp://u:")
    assert "hunter2" not in described
    assert describe(TimeoutError()) == "TimeoutError"


def test_the_verdict_lists_each_check_and_marks_a_full_list() -> None:
    """Each check is ok or counts its violations ('+' when the list was cut at the limit)."""
    verdict = Verdict(
        {"expired": 3, "held": 1},
        {"one transition per expiry": [], "none expired early": [("r1", "early"), ("r2", "x")]},
        limit=2,
    )
    assert verdict.failed
    assert verdict.lines() == [
        "reservations: expired 3, held 1",
        f"{'one transition per expiry':42} ok",
        f"{'none expired early':42} 2+ VIOLATION(S)",
        "    r1  early",
        "    r2  x",
        "verify: FAILED",
    ]
    assert verdict.as_json()["ok"] is False


def test_a_clean_verdict_passes() -> None:
    """No violation: the last line says every effect happened exactly once."""
    verdict = Verdict({"expired": 3}, {"a": [], "b": []}, limit=20)
    assert not verdict.failed
    assert verdict.lines()[-1] == "verify: every effect happened exactly once"
    assert verdict.as_json() == {
        "ok": True,
        "totals": {"expired": 3},
        "violations": {"a": [], "b": []},
    }


def test_an_empty_listing_says_so_and_a_full_one_says_what_next() -> None:
    """No match: one line; matches: the table, then the count and the next commands."""
    assert dead_letters.list_lines([]) == ["no dead letters match"]
    record = {"id": 7, "error_class": "poison.not-json", "status": "dead", "attempts": 1}
    lines = "\n".join(dead_letters.list_lines([record])).splitlines()
    assert lines[0].split()[:3] == ["ID", "LAST_SEEN", "ERROR_CLASS"]
    assert lines[-1] == "1 dead letter(s); details: show ID; retry: replay ID --operator NAME"


def test_a_detail_shows_its_fields_its_trail_and_its_replays() -> None:
    """One field a line, aligned; 'none' for an empty trail and no replays."""
    at = datetime(2026, 1, 1, tzinfo=UTC)
    detail = dead_letters.Detail({"id": 7, "message_id": "m\x1b[2J", "last_seen": at})
    lines = detail.lines()
    assert lines[:3] == [
        "id          7",
        "message_id  m?[2J",
        "last_seen   2026-01-01T00:00:00+00:00",
    ]
    assert lines[3:] == [
        "",
        "transitions (audit trail):",
        "  none",
        "",
        "replays:",
        "  none",
        "",
        "owner, notes, closing (audit):",
        "  none",
    ]
    assert detail.as_json() == {
        "id": "7",
        "message_id": "m?[2J",
        "last_seen": "2026-01-01T00:00:00+00:00",
        "transitions": [],
        "replays": [],
        "events": [],
    }


@pytest.mark.parametrize("operator", [None, "", "   "])
def test_a_replay_needs_a_named_operator(operator: str | None) -> None:
    """No --operator (or only blanks): refused before anything is opened."""
    with pytest.raises(UsageError, match="needs --operator NAME"):
        dead_letters.actor_named(operator)


def test_the_replay_report_counts_each_outcome() -> None:
    """One line per dead letter, then the counts by outcome; a failed publish fails it."""
    results = [
        replay.ReplayResult(1, "m-1", "republished", "from expirations.dead; it will expire"),
        replay.ReplayResult(2, "m-2", "publish-failed", "nacked by the broker"),
    ]
    lines = replay.report_lines(results, dry_run=False)
    assert lines[0] == f"{'republished':16} #1  m-1  (from expirations.dead; it will expire)"
    assert lines[-1] == "replay: 2 selected, 1 publish-failed, 1 republished"
    assert replay.any_failed(results)
    assert not replay.any_failed(results[:1])


def test_a_dry_run_changes_nothing_and_says_what_would_happen() -> None:
    """Every selected dead letter would be republished, with its expectation."""
    rows: list[Any] = [{"id": 3, "message_id": "m-3"}]
    results = replay.dry_run(rows, {3: "the hold is held and due: it will expire"})
    assert results == [
        replay.ReplayResult(3, "m-3", "would-republish", "the hold is held and due: it will expire")
    ]
    assert replay.report_lines(results, dry_run=True)[-1] == (
        "replay (dry run): 1 selected, 1 would-republish"
    )
