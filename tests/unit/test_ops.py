"""Unit tests for ``service/ops``: what status, verify and the dead-letter operations show."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from service.adapters.postgres.audit_trail import AwaitingScan, EventTotals
from service.adapters.postgres.leases import ScanPass
from service.core.errors import UsageError
from service.ops import dead_letters, replay
from service.ops.survey import describe
from service.ops.verification import Verdict


def test_a_broker_error_is_described_without_its_password() -> None:
    """``Type: message``, with any URL password redacted."""
    described = describe(ConnectionError("cannot reach amqp://u:hunter2@h:5672/"))
    assert described.startswith("ConnectionError: cannot reach amqp://u:")
    assert "hunter2" not in described
    assert describe(TimeoutError()) == "TimeoutError"


def test_the_verdict_lists_each_check_and_marks_a_full_list() -> None:
    """The verdict first, naming the broken checks; each check is ok or counts its
    violations ('+' when the list was cut at the limit); exit 1."""
    verdict = Verdict(
        {"expired": 3, "held": 1},
        {"one transition per expiry": [], "none expired early": [("r1", "early"), ("r2", "x")]},
        limit=2,
    )
    assert verdict.failed
    assert verdict.exit_code == 1
    assert verdict.lines() == [
        "verify: FAILED: none expired early (2); verify --json lists the reservations",
        "reservations: expired 3, held 1",
        "window: the whole audit trail",
        f"{'one transition per expiry':42} ok",
        f"{'none expired early':42} 2+ VIOLATION(S)",
        "    r1  early",
        "    r2  x",
    ]
    assert verdict.as_json()["ok"] is False
    assert verdict.as_json()["state"] == "violated"


def test_the_verdict_says_where_its_window_begins_and_what_is_beyond_it() -> None:
    """Past retention, the audit trail begins at a week's start: verify proves the holds due
    since then, and says how many expired ones are beyond it."""
    since = datetime(2026, 9, 7, tzinfo=UTC)
    verdict = Verdict({"expired": 9, "expired_before_window": 4}, {"a": []}, 5, since=since)
    assert verdict.proven
    assert verdict.lines()[0] == (
        "verify: every effect in the window happened exactly once (holds due since "
        "2026-09-07T00:00:00+00:00; older ones are past retention)"
    )
    assert verdict.lines()[2].startswith("window: holds due since 2026-09-07T00:00:00+00:00")
    assert "4 expired hold(s) due before it" in verdict.lines()[2]
    assert verdict.as_json()["proven_since"] == "2026-09-07T00:00:00+00:00"


def test_a_clean_verdict_passes() -> None:
    """No violation and nothing awaiting a scan: proven, exit 0, the JSON keeps its keys."""
    verdict = Verdict({"expired": 3}, {"a": [], "b": []}, limit=20)
    assert not verdict.failed
    assert verdict.exit_code == 0
    assert verdict.lines()[0] == "verify: every effect happened exactly once"
    data = verdict.as_json()
    assert {key: data[key] for key in ("ok", "proven", "state", "totals", "violations")} == {
        "ok": True,
        "proven": True,
        "state": "proven",
        "totals": {"expired": 3},
        "violations": {"a": [], "b": []},
    }
    assert data["awaiting_scan"] == {"holds": 0, "oldest_due": None, "oldest_due_seconds": None}
    assert data["last_pass"] is None


def test_holds_awaiting_a_scan_are_not_a_violation_nor_proof() -> None:
    """Due holds no pass has covered yet: exit 4, a line saying how many, since when, and
    what the last pass was (never, or how long ago and how it went)."""
    due = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    awaiting = AwaitingScan(3, due, 192.0)
    never = Verdict({"held": 3}, {"a": []}, 20, awaiting)
    assert not never.failed
    assert never.exit_code == 4
    assert never.lines()[0] == (
        "verify: no violation, but not proven yet: 3 due hold(s) await a scan, due since "
        "2026-01-01T12:00:00+00:00 (3m 12s ago); last scan pass: never; run the scan "
        "(python -m service.produce --scan) and verify again"
    )
    assert never.as_json()["ok"] is True
    assert never.as_json()["state"] == "awaiting-scan"
    scan = ScanPass("host:7", None, due, "unconfirmed", 0, 2, 7200.0)
    seen = Verdict({"held": 3}, {"a": []}, 20, awaiting, scan)
    assert "last scan pass ended 2h ago: unconfirmed (host:7)" in seen.lines()[0]
    assert seen.as_json()["last_pass"] == {
        "scanner": "host:7",
        "finished_at": "2026-01-01T12:00:00+00:00",
        "age_seconds": 7200.0,
        "result": "unconfirmed",
    }
    broken = Verdict({"held": 3}, {"a": [("r1", "x")]}, 20, awaiting)
    assert broken.exit_code == 1
    assert broken.lines()[-1].startswith("3 due hold(s) await a scan")


def test_an_empty_listing_says_so_and_a_full_one_says_what_next() -> None:
    """No match: one line; matches: the table, then the count and the next commands."""
    assert dead_letters.list_lines([]) == ["no dead letters match"]
    record = {"id": 7, "error_class": "poison.not-json", "status": "dead", "attempts": 1}
    lines = "\n".join(dead_letters.list_lines([record])).splitlines()
    assert lines[0].split()[:3] == ["ID", "LAST_SEEN", "ERROR_CLASS"]
    assert lines[-1] == "1 dead letter(s); details: show ID; retry: replay ID --operator NAME"


def test_a_detail_shows_its_fields_its_policy_its_trail_and_its_replays() -> None:
    """One field a line, aligned, the policy in words; 'none' for an empty trail and no
    replays; numbers stay numbers in the machine form."""
    at = datetime(2026, 1, 1, tzinfo=UTC)
    detail = dead_letters.Detail({"id": 7, "message_id": "m\x1b[2J", "last_seen": at})
    lines = detail.lines()
    assert lines[:4] == [
        "id          7",
        "message_id  m?[2J",
        "last_seen   2026-01-01T00:00:00+00:00",
        "policy      not known (recorded before this version)",
    ]
    assert lines[4:] == [
        "",
        "retry policy now, against the one it was dead-lettered under:",
        "  the same",
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
        "id": 7,
        "message_id": "m?[2J",
        "last_seen": "2026-01-01T00:00:00+00:00",
        "policy": None,
        "policy_changes": [],
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


def test_a_replay_refused_without_an_operator_shows_as_none_given() -> None:
    """A refusal audited without --operator records the operator empty: ``show`` names it
    "(none given)", the machine form keeps it as recorded."""
    refusal = {
        "at": datetime(2026, 1, 1, tzinfo=UTC),
        "operator": "",
        "db_user": "expiry_operator",
        "os_user": "root",
        "client_host": "ops-1",
        "outcome": "refused",
        "detail": "this needs --operator NAME",
    }
    detail = dead_letters.Detail({"id": 7}, replays=[refusal])
    text = "\n".join(detail.lines()).splitlines()
    [row] = [line for line in text if line.endswith("refused  this needs --operator NAME")]
    assert row.split()[1:3] == ["(none", "given)"]
    assert detail.as_json()["replays"][0]["operator"] == ""


def test_the_outbox_has_its_line_and_its_checks_name_what_is_wrong() -> None:
    """The events' counts and window on a line of their own (and in the JSON); a broken
    promise of the outbox is named on the verdict line like any other check."""
    since = datetime(2026, 12, 1, 9, 12, 44, tzinfo=UTC)
    events = EventTotals(pending=2, sent=198, oldest_pending_seconds=0.4, since=since)
    proven = Verdict({"expired": 200}, {"expired-without-exactly-one-event": []}, 20, events=events)
    assert proven.exit_code == 0
    assert proven.lines()[2] == "window: the whole audit trail"
    assert proven.lines()[3] == (
        "events: sent 198, pending 2 (the oldest 0.4s old); checked for the expiries since "
        "2026-12-01T09:12:44+00:00 (the outbox's start, or where the audit trail or the "
        "record of sent events begins, whichever is last)"
    )
    assert proven.as_json()["events"] == {
        "pending": 2,
        "sent": 198,
        "oldest_pending_seconds": 0.4,
        "checked_since": "2026-12-01T09:12:44+00:00",
    }
    stuck = Verdict(
        {"expired": 200},
        {
            "event-pending-too-long": [
                ("r1", "pending for 02:00:00 (expired:r1:1, claimed 0 time(s))")
            ]
        },
        20,
        events=EventTotals(1, 0, None, None),
    )
    assert stuck.exit_code == 1
    assert stuck.lines()[0] == (
        "verify: FAILED: event-pending-too-long (1); verify --json lists the reservations"
    )
    assert "events: sent 0, pending 1; checked for every expiry" in stuck.lines()[3]
