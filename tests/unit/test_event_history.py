"""What an operator reads of an event's webhooks (``service/ops/event_history.py``): each
endpoint's state, told in one line whatever the state, and each attempt in one."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from service.adapters.postgres.webhook_attempts import Event, LoggedAttempt, Waiting
from service.ops.event_history import EndpointStory, EventStory, _endpoints

WRITTEN = datetime(2026, 12, 6, 7, 0, tzinfo=UTC)
EVENT = Event("expired:x:1", uuid.uuid4(), WRITTEN, WRITTEN, "sent")


def _attempt(endpoint: str, status: int | None, error: str | None) -> LoggedAttempt:
    return LoggedAttempt(endpoint, WRITTEN, 1, "automatic", status, error, 12.5, "d1")


def _waiting(endpoint: str, *, dead: bool) -> Waiting:
    return Waiting(endpoint, dead, 1, WRITTEN + timedelta(seconds=30), 503, "x", "automatic")


@pytest.mark.parametrize(
    ("attempts", "waiting", "registered", "state", "said"),
    [
        ([_attempt("crm", 200, None)], None, WRITTEN, "delivered", "delivered, after 1"),
        (
            [_attempt("crm", 503, "x")],
            _waiting("crm", dead=False),
            WRITTEN,
            "pending",
            "the next at",
        ),
        ([_attempt("crm", 503, "x")], _waiting("crm", dead=True), WRITTEN, "dead", "dead letter"),
        ([], None, WRITTEN + timedelta(hours=1), "registered-later", "--backfill crm"),
        ([], None, WRITTEN - timedelta(hours=1), "nothing-recorded", "retired since"),
        ([_attempt("crm", None, "webhook.timed-out")], None, None, "nothing-recorded", "retired"),
    ],
)
def test_each_state_is_told_in_a_line_then_each_attempt(
    attempts: list[LoggedAttempt],
    waiting: Waiting | None,
    registered: datetime | None,
    state: str,
    said: str,
) -> None:
    registry = {} if registered is None else {"crm": registered}
    [story] = _endpoints(EVENT, attempts, [waiting] if waiting else [], registry)
    assert story.state == state
    lines = story.lines()
    assert lines[0].startswith("  crm: ")
    assert said in lines[0]
    assert len(lines) == 1 + len(attempts)
    assert story.as_json()["state"] == state


def test_an_event_with_no_endpoint_says_so() -> None:
    story = EventStory(EVENT, [])
    assert story.lines()[1] == "  no webhook endpoint is registered"
    assert story.as_json()["endpoints"] == []


def test_an_attempt_line_has_no_answer_when_none_came() -> None:
    story = EndpointStory("crm", "nothing-recorded", [_attempt("crm", None, "webhook.timed-out")])
    assert "no answer, webhook.timed-out, 12.5 ms, by d1" in story.lines()[1]
