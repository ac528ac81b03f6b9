"""The state of a deployment as ``service/ops/health.py`` decides it, and as the screen
(``service/ops/screen.py``) shows it: pure, no service needed."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from service.adapters.postgres.leases import ScanPass
from service.adapters.postgres.outbox import Pending
from service.adapters.postgres.webhook_endpoints import EndpointBacklog
from service.adapters.telemetry.readings import Backlog
from service.ops.conditions import Condition
from service.ops.health import QueueState, Status
from service.ops.screen import as_json, dead_letter_note, pass_rows, queue_rows, render

STALL = 25.0
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _pass(age: float = 2.0, result: str = "ok", scanner: str = "scan-1") -> ScanPass:
    ended = NOW - timedelta(seconds=age)
    return ScanPass(scanner, ended - timedelta(seconds=1), ended, result, 3, 0, age)


def _queues(**changes: tuple[int | None, int | None]) -> list[QueueState]:
    figures: dict[str, tuple[int | None, int | None]] = {
        "expirations": (0, 2),
        "expirations.retry.1s": (1, 0),
        "expirations.retry.857ms": (2, 0),
        "expirations.retry.5s": (0, 0),
        "expirations.dead": (0, 0),
        "expirations.dead.log": (0, 2),
    }
    figures.update(changes)
    return [QueueState(name, ready, consumers) for name, (ready, consumers) in figures.items()]


def _well(**overrides: Any) -> Status:
    """All well: little due, consumers attached, a scan pass a moment ago."""
    values: dict[str, Any] = {
        "at": "2026-01-01T00:00:00+00:00",
        "objective_seconds": 120.0,
        "scan_stall_seconds": STALL,
        "backlog": Backlog(1.5, {"lt_10s": 2, "10s_1m": 0}),
        "passes": [_pass()],
        "queues": _queues(),
    }
    values.update(overrides)
    return Status(**values)


def test_all_well_is_ok_and_exits_zero() -> None:
    """No problem: exit 0, and the verdict says how old the oldest due hold is, in human form."""
    status = _well()
    assert status.problems == []
    assert status.exit_code == 0
    assert status.verdict == (
        "OK: the oldest due hold is 1.5s old (objective 2m); 2 consumer(s); last scan pass 2.0s ago"
    )


@pytest.mark.parametrize(
    ("overrides", "condition", "code", "verdict"),
    [
        (
            {"backlog": None, "passes": [], "database_error": "ConnectionError: refused"},
            Condition.DATABASE_UNREACHABLE,
            1,
            "DOWN: PostgreSQL cannot be reached",
        ),
        (
            {"queues": [], "broker_error": "ConnectionError: refused"},
            Condition.BROKER_UNREACHABLE,
            1,
            "DOWN: RabbitMQ cannot be reached",
        ),
        (
            {"backlog": None, "passes": [], "not_migrated": "no schema_migrations table"},
            Condition.NOT_MIGRATED,
            5,
            "NOT SET UP: the database is not migrated",
        ),
        (
            {"queues": _queues(**{"expirations.retry.5s": (None, None)})},
            Condition.TOPOLOGY_NOT_DECLARED,
            5,
            "NOT SET UP: the topology is not declared",
        ),
        (
            {"backlog": Backlog(192.0, {"1m_5m": 7})},
            Condition.OBJECTIVE_BREACHED,
            3,
            "ALERT: the oldest due hold is 3m 12s old, over the objective of 2m",
        ),
        (
            {"queues": _queues(expirations=(5, 0))},
            Condition.NO_CONSUMER,
            4,
            "DEGRADED: no consumer is attached to expirations",
        ),
        (
            {"passes": []},
            Condition.NO_SCAN_YET,
            4,
            "DEGRADED: no scan pass has been recorded yet",
        ),
        (
            {"passes": [_pass(age=3600.0)]},
            Condition.SCANNER_STOPPED,
            4,
            "DEGRADED: the scanner looks stopped: no pass has ended for 1h",
        ),
        (
            {"passes": [_pass(result="unconfirmed")]},
            Condition.SCAN_FAILING,
            4,
            "DEGRADED: the last scan pass failed",
        ),
    ],
)
def test_each_state_has_its_problem_verdict_and_exit_code(
    overrides: dict[str, Any], condition: Condition, code: int, verdict: str
) -> None:
    """One problem per state: the verdict names it, and the exit code is its own."""
    status = _well(**overrides)
    assert [problem.condition for problem in status.problems] == [condition]
    assert status.exit_code == code
    assert status.verdict == verdict


def test_the_most_severe_problem_decides_and_every_one_is_listed() -> None:
    """Unreachable beats not set up beats the objective beats degraded; all are kept."""
    status = _well(
        backlog=Backlog(500.0, {"gt_15m": 1}),
        passes=[],
        queues=_queues(expirations=(1, 0), **{"expirations.dead": (None, None)}),
    )
    conditions = [problem.condition for problem in status.problems]
    assert conditions == [
        Condition.TOPOLOGY_NOT_DECLARED,
        Condition.OBJECTIVE_BREACHED,
        Condition.NO_CONSUMER,
        Condition.NO_SCAN_YET,
    ]
    assert status.exit_code == 5
    assert status.verdict == "NOT SET UP: the topology is not declared (and 3 more problems below)"
    broken = _well(broker_error="E", queues=[], backlog=None, not_migrated="x")
    assert broken.exit_code == 1
    assert [p.condition for p in broken.problems] == [
        Condition.BROKER_UNREACHABLE,
        Condition.NOT_MIGRATED,
    ]


def test_a_long_pass_that_still_publishes_is_not_a_stopped_scanner() -> None:
    """A pass records itself at its end: a recent publish means it is still under way, for
    the first pass too; without one, an old pass means a stopped scanner."""
    assert _well(passes=[_pass(age=600.0)], newest_publish_age_seconds=3.0).problems == []
    assert _well(passes=[], newest_publish_age_seconds=3.0).problems == []
    stale = _well(passes=[_pass(age=600.0)], newest_publish_age_seconds=STALL + 1)
    assert [p.condition for p in stale.problems] == [Condition.SCANNER_STOPPED]
    assert stale.problems[0].meaning.startswith("the last (ok, scan-1) is older than")


def test_a_failing_scanner_beside_a_working_one_is_named_while_it_is_recent() -> None:
    """Another scanner's failed pass counts while recent; an old one of a gone process
    (a cron scan's earlier pid) does not."""
    recent = _well(passes=[_pass(), _pass(age=5.0, result="failed", scanner="scan-2")])
    [problem] = recent.problems
    assert problem.summary == "a scan pass failed"
    assert "scan-2: failed, 0 not confirmed, 5.0s ago" in problem.meaning
    gone = _well(passes=[_pass(), _pass(age=900.0, result="failed", scanner="scan-2")])
    assert gone.problems == []


def test_no_consumer_says_how_many_holds_wait() -> None:
    """The line says what it means (due holds wait) and what to do (start consumers)."""
    [problem] = _well(queues=_queues(expirations=(2, 0))).problems
    assert problem.line == (
        "no consumer is attached to expirations: 2 due hold(s) wait and nothing is expired, "
        "even if consumer processes run. Start consumers (python -m service.consume); check "
        "their /readyz and logs."
    )


def test_the_delay_queues_are_one_row_with_their_sums() -> None:
    """Every expirations.retry.* queue (several per tier with jitter) is one row, where the
    first stood, ready and consumers summed, missing ones counted."""
    rows = queue_rows(_queues(**{"expirations.retry.5s": (None, None)}))
    assert [(r.label, r.ready, r.consumers, r.missing) for r in rows] == [
        ("expirations", 0, 2, 0),
        ("expirations.retry.* (3 delay queues)", 3, 0, 1),
        ("expirations.dead", 0, 0, 0),
        ("expirations.dead.log", 0, 2, 0),
    ]


def test_the_dead_letter_note_says_why_the_queue_and_the_records_differ() -> None:
    """More copies than open records points at tidy; fewer says a replay rebuilds them."""
    more = _well(queues=_queues(**{"expirations.dead": (3, 0)}), dead_letters_by_class={"x": 1})
    assert dead_letter_note(more) == (
        "expirations.dead holds 2 message(s) more than the 1 open dead letter(s): copies not "
        "yet recorded (consumers record them from expirations.dead.log), or copies of closed "
        "or replayed dead letters; python -m service.deadletters tidy removes copies of "
        "closed or replayed dead letters"
    )
    fewer = _well(dead_letters_by_class={"x": 2})
    assert dead_letter_note(fewer) == (
        "2 open dead letter(s) have no copy in expirations.dead (taken or purged): a replay "
        "rebuilds the command from the record"
    )
    agree = _well(queues=_queues(**{"expirations.dead": (2, 0)}), dead_letters_by_class={"x": 2})
    assert dead_letter_note(agree) is None


def test_passes_are_marked_stale_or_failed() -> None:
    """A pass older than a running scanner's can be is stale; unconfirmed or failed, failed."""
    status = _well(passes=[_pass(), _pass(age=7200.0, result="unconfirmed", scanner="old")])
    rows = pass_rows(status)
    assert [(r.scanner, r.ended, r.stale, r.failed) for r in rows] == [
        ("scan-1", "2.0s ago", False, False),
        ("old", "2h ago", True, True),
    ]


def test_the_screen_opens_with_the_verdict_and_shows_ages_for_people() -> None:
    """The verdict, a line per problem, then figures: human ages, the delay queues as one."""
    status = _well(
        backlog=Backlog(218393913.1, {"gt_15m": 1}),
        passes=[_pass(age=192.0)],
        queues=_queues(expirations=(1, 0)),
        newest_publish_age_seconds=None,
    )
    lines = render(status).splitlines()
    assert lines[0].startswith("ALERT: the oldest due hold is 6.9 years old")
    assert [line[:2] for line in lines[1:4]] == ["- ", "- ", "- "]
    assert any(line.split()[:4] == ["oldest", "due", "hold", "6.9"] for line in lines)
    assert any(line.startswith("expirations.retry.* (3 delay queues)") for line in lines)
    [scan] = [line for line in lines if line.startswith("  scan-1")]
    assert scan.split()[1:5] == ["ended", "3m", "12s", "ago"]
    assert scan.endswith("STALE")
    assert "218393913" not in render(status)


def test_the_screen_says_which_side_could_not_be_read() -> None:
    """The database down: its figures are not read, the queues still shown; and vice versa."""
    database_down = render(_well(backlog=None, passes=[], database_error="E")).splitlines()
    assert "database figures not read: PostgreSQL cannot be reached" in database_down
    assert any(line.startswith("expirations.dead.log") for line in database_down)
    broker_down = render(_well(queues=[], broker_error="E")).splitlines()
    assert "  not read: RabbitMQ cannot be reached" in broker_down
    assert any(line.startswith("oldest due hold") for line in broker_down)


def test_the_json_carries_the_verdict_and_problems_as_data_and_every_queue() -> None:
    """Numbers stay numbers (seconds), each delay queue is kept, problems are data."""
    status = _well(backlog=Backlog(192.0, {"1m_5m": 7}), passes=[_pass(age=3600.0)])
    data = json.loads(json.dumps(as_json(status)))
    assert data["exit_code"] == 3
    assert data["verdict"] == status.verdict
    assert [p["condition"] for p in data["problems"]] == [
        "objective-breached",
        "scanner-stopped",
    ]
    assert [p["exit_code"] for p in data["problems"]] == [3, 4]
    assert data["backlog"] == {
        "oldest_due_age_seconds": 192.0,
        "by_bucket": {"1m_5m": 7},
        "total": 7,
    }
    assert data["objective_met"] is False
    assert data["scan_passes"][0]["age_seconds"] == 3600.0
    assert data["scan_passes"][0]["stale"] is True
    assert len(data["queues"]) == 6
    unread = as_json(_well(backlog=None, passes=[], database_error="E"))
    assert unread["backlog"] is None
    assert unread["objective_met"] is None


def test_events_waiting_past_their_objective_are_an_alert_saying_start_the_relay() -> None:
    """The oldest pending event older than EXPIRY_EVENTS_OBJECTIVE_SECONDS: an objective
    missed (exit 3, like the oldest due hold's), saying how many wait and to start or
    check the relay; within it, nothing is wrong, and the screen and JSON show the
    backlog either way."""
    within = _well(events=Pending(3, 2.5), events_objective_seconds=60.0)
    assert within.problems == []
    assert "pending events            3    the oldest 2.5s old, within the objective (1m)" in (
        render(within)
    )
    behind = _well(events=Pending(40, 312.0), events_objective_seconds=60.0)
    [problem] = behind.problems
    assert (problem.condition, problem.exit_code, behind.exit_code) == (
        Condition.EVENTS_BEHIND,
        3,
        3,
    )
    assert behind.verdict == (
        "ALERT: the oldest pending event is 5m 12s old, over the objective of 1m"
    )
    assert "40 event(s) wait in the outbox" in problem.meaning
    assert problem.todo.startswith(
        "Events are not being published: start python -m service.relay, or check it"
    )
    assert "OVER the objective (1m)" in render(behind)
    assert json.loads(json.dumps(as_json(behind)))["events"] == {
        "pending": 40,
        "oldest_pending_age_seconds": 312.0,
        "objective_seconds": 60.0,
        "objective_met": False,
    }
    empty = _well(events=Pending(0, 0.0))
    assert "pending events            0    within the objective (1m)" in render(empty)
    assert as_json(_well())["events"] is None  # not read: no line, null
    assert "pending events" not in render(_well())


def test_webhook_endpoints_behind_or_paused_are_said_with_what_to_do() -> None:
    """Each registered endpoint has its line (pending, the oldest, dead, a pause); one whose
    oldest pending delivery is past EXPIRY_WEBHOOK_OBJECTIVE_SECONDS is an objective
    missed (exit 3), a paused one degraded (exit 4); the JSON carries each endpoint."""
    current = EndpointBacklog("crm", pending=2, dead=0, oldest_age=1.5, paused_for=0.0)
    within = _well(webhooks=[current], webhook_objective_seconds=300.0)
    assert within.problems == []
    assert "webhook crm                          2 pending, the oldest 1.5s old, 0 dead" in (
        render(within)
    )
    late = EndpointBacklog("orders", pending=7, dead=1, oldest_age=900.0, paused_for=40.0)
    both = _well(webhooks=[current, late], webhook_objective_seconds=300.0)
    conditions = [(p.condition, p.exit_code) for p in both.problems]
    assert conditions == [(Condition.WEBHOOKS_BEHIND, 3), (Condition.WEBHOOK_PAUSED, 4)]
    assert both.exit_code == 3
    assert "PAUSED 40s" in render(both)
    behind = both.problems[0]
    assert behind.summary == (
        "webhook endpoint orders: the oldest pending delivery is 15m old, over the objective of 5m"
    )
    assert "python -m service.deliver" in behind.todo
    [_, shown] = json.loads(json.dumps(as_json(both)))["webhooks"]
    assert shown == {
        "endpoint": "orders",
        "pending": 7,
        "dead": 1,
        "oldest_age": 900.0,
        "paused_for": 40.0,
        "disabled_at": None,
        "objective_seconds": 300.0,
    }
    assert as_json(_well())["webhooks"] is None


def test_a_disabled_webhook_endpoint_is_said_with_since_when_and_how_to_enable_it() -> None:
    """An endpoint that answered 410 Gone: degraded (exit 4), since when, that its
    deliveries wait without ageing, and the command that enables it; in the JSON too."""
    since = datetime(2026, 12, 6, 7, 0, tzinfo=UTC)
    gone = EndpointBacklog(
        "orders", pending=12, dead=0, oldest_age=30.0, paused_for=0.0, disabled_at=since
    )
    status = _well(webhooks=[gone], webhook_objective_seconds=300.0)
    [problem] = status.problems
    assert (problem.condition, problem.exit_code) == (Condition.WEBHOOK_DISABLED, 4)
    assert problem.summary == (
        "webhook endpoint orders is disabled since 2026-12-06T07:00:00+00:00: it answered 410 Gone"
    )
    assert "12 delivery(ies) wait" in problem.meaning
    assert "python -m service.deliver --enable orders" in problem.todo
    assert "DISABLED (410 Gone) since 2026-12-06 07:00:00+0000" in render(status)
    [shown] = json.loads(json.dumps(as_json(status)))["webhooks"]
    assert shown["disabled_at"] == "2026-12-06T07:00:00+00:00"
