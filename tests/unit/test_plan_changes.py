"""Unit tests for ``service/ops/plan_changes.py``: a planned dead letter left out because it
changed since its dry run is left out naming what changed, and who changed it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from service.core.default_owners import DEFAULT_OPERATOR
from service.ops import plan_changes

SINCE = datetime(2026, 12, 3, 7, 0, tzinfo=UTC)
BEFORE = SINCE - timedelta(minutes=5)
AFTER = SINCE + timedelta(seconds=30)


def row(**values: Any) -> dict[str, Any]:
    """A dead-letter record as it is now."""
    return {"id": 7, "status": "dead", "times_dead": 1, "last_seen": BEFORE, **values}


def event(kind: str, operator: str, detail: str | None, at: datetime) -> dict[str, Any]:
    """A row of ``dead_letter_events``."""
    return {"kind": kind, "operator": operator, "detail": detail, "at": at}


def replayed(outcome: str, operator: str, at: datetime) -> dict[str, Any]:
    """A row of ``dead_letter_replays``."""
    return {"outcome": outcome, "operator": operator, "detail": "d", "at": at}


DEFAULT = event("assigned", DEFAULT_OPERATOR, "team-a (error class matched db.*)", BEFORE)


@pytest.mark.parametrize(
    ("now", "events", "replays", "said"),
    [
        (row(), [event("assigned", "bob", "team-db", AFTER)], [], "owner set to team-db (by bob)"),
        (
            row(),
            [DEFAULT, event("assigned", "bob", "team-db", AFTER)],
            [],
            "owner changed from team-a to team-db (by bob)",
        ),
        (row(), [event("noted", "bob", "lock holder", AFTER)], [], "note added (by bob)"),
        (
            row(),
            [event("noted", "bob", "one", BEFORE), event("noted", "eve", "two", AFTER)],
            [],
            "note changed (by eve)",
        ),
        (row(status="closed"), [event("closed", "carol", "no", AFTER)], [], "closed (by carol)"),
        (row(), [event("reopened", "carol", "back", AFTER)], [], "reopened (by carol)"),
        (
            row(status="replayed"),
            [],
            [replayed("refused", "mallory", AFTER), replayed("republished", "dave", AFTER)],
            "replayed (by dave)",
        ),
        (
            row(times_dead=3, last_seen=AFTER),
            [],
            [],
            "dead-lettered again (3 times in all)",
        ),
        (
            row(status="closed"),
            [
                DEFAULT,
                event("closed", "carol", "no", AFTER + timedelta(seconds=2)),
                event("assigned", "bob", "team-db", AFTER),
            ],
            [],
            "owner changed from team-a to team-db (by bob); closed (by carol)",
        ),
    ],
)
def test_what_changed_since_the_dry_run_is_named(
    now: dict[str, Any],
    events: list[dict[str, Any]],
    replays: list[dict[str, Any]],
    said: str,
) -> None:
    """Each act recorded after the dry run read the record, in order, with who did it; the
    owner it had before is named when its trail knows it; a new dead-lettering too."""
    assert plan_changes.describe(now, SINCE, events, replays) == (
        f"changed since the dry run: {said}"
    )


def test_a_change_with_nothing_recorded_since_says_what_it_can() -> None:
    """Acts recorded before the dry run are not news; a change the trail does not explain
    (another confirmation claimed it) says so; without the dry run's time, only the status."""
    before = [DEFAULT, event("noted", "bob", "old", BEFORE)]
    unexplained = plan_changes.describe(row(), SINCE, before, [])
    assert unexplained.startswith("changed since the dry run (nothing recorded since")
    assert unexplained.endswith("now dead")
    assert plan_changes.describe(row(status="closed"), None, before, []) == (
        "changed since the dry run: now closed"
    )


def test_names_in_the_trail_are_shown_inert() -> None:
    """An owner or an operator holding control characters is shown with '?' for them."""
    said = plan_changes.describe(row(), SINCE, [event("assigned", "b\x1bob", "t\neam", AFTER)], [])
    assert said == "changed since the dry run: owner set to t?eam (by b?ob)"
