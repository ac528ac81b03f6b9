"""Unit tests for ``service/ops/plans.py``: a selection is never empty, a plan's form is
read strictly, and a planned record is acted on only as the dry run saw it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from service.core.errors import UsageError
from service.ops import plans
from service.ops.plans import Group, Plan, Planned, Selection


def row(**values: Any) -> dict[str, Any]:
    """A dead-letter record as the data layer reads it (with its revision)."""
    base = {
        "id": 7,
        "message_id": "m-7",
        "revision": "100",
        "status": "dead",
        "error_class": "db.unavailable",
        "give_up": "attempts-exhausted",
    }
    return {**base, **values}


def test_a_selection_of_nothing_is_refused() -> None:
    """Neither named dead letters nor a group: nothing is selected, never everything."""
    with pytest.raises(UsageError, match="nothing selected"):
        Selection()
    with pytest.raises(UsageError, match="not both"):
        Selection(keys=("7",), group=Group())
    assert Selection(group=Group()).group == Group()  # "every open one" only when chosen


@pytest.mark.parametrize(
    ("token", "items"),
    [
        ("", ()),
        ("7:100", (Planned(7, "100"),)),
        ("7:100,8:101,7:100", (Planned(7, "100"), Planned(8, "101"))),
    ],
)
def test_a_plan_token_reads_back_its_items(token: str, items: tuple[Planned, ...]) -> None:
    """``id:revision`` pairs, each once, in order."""
    assert plans.parse_items(token) == items


@pytest.mark.parametrize("token", ["7", "7:x", "x:1", "7:1;8:2", "-7:1", "7:1:2", "7:" + "9" * 11])
def test_a_forged_plan_token_is_refused(token: str) -> None:
    """Anything but ``id:revision`` pairs of digits is refused: dry-run again."""
    with pytest.raises(UsageError, match="dry-run again"):
        plans.parse_items(token)


def test_a_plan_holds_at_most_its_limit() -> None:
    """A form can carry no more than PLAN_LIMIT dead letters."""
    token = ",".join(f"{n}:1" for n in range(plans.PLAN_LIMIT + 1))
    with pytest.raises(UsageError, match="at most"):
        plans.parse_items(token)


def test_a_plan_token_round_trips() -> None:
    """What the dry run's form carries is what the confirmation reads."""
    planned = Plan("replay", Selection(keys=("7",)), (Planned(7, "100"), Planned(9, "4")))
    assert plans.parse_items(planned.token()) == planned.items


@pytest.mark.parametrize(
    ("act", "group", "values", "holds"),
    [
        ("replay", Group(), {}, True),
        ("replay", Group(status="closed"), {"status": "closed"}, True),
        ("replay", Group(status="dead"), {"status": "closed"}, False),
        ("replay", Group(), {"status": "replayed"}, False),
        ("close", Group(), {"status": "closed"}, False),
        ("reopen", Group(status="dead"), {"status": "dead"}, False),
        ("replay", Group(error_class="db.unavailable"), {}, True),
        ("replay", Group(error_class="poison.not-json"), {}, False),
        ("assign", Group(give_up="permanent"), {}, False),
    ],
)
def test_a_group_holds_what_its_act_applies_to(
    act: str, group: Group, values: dict[str, Any], holds: bool
) -> None:
    """A group's records: its class, give-up reason and status, among those the act takes."""
    assert group.holds(row(**values), act) is holds


@pytest.mark.parametrize(
    ("now", "group", "keys", "why"),
    [
        (row(), Group(), set(), None),
        (None, Group(), set(), "no longer exists"),
        (row(revision="101", status="replayed"), Group(), set(), "changed since the dry run"),
        (row(error_class="other"), Group(error_class="db.unavailable"), set(), "not in the group"),
        (row(), None, {"7"}, None),
        (row(), None, {"m-7"}, None),
        (row(), None, {"8"}, "not one of the dead letters"),
    ],
)
def test_a_planned_record_is_acted_on_only_as_the_dry_run_saw_it(
    now: dict[str, Any] | None, group: Group | None, keys: set[str], why: str | None
) -> None:
    """Gone, changed, or (a forged plan) outside the selection: left out, with why."""
    found = plans.unfit(now, Planned(7, "100"), "replay", group, keys)
    assert (found is None) if why is None else (found is not None and why in found)


@pytest.mark.parametrize(
    "values", [{"error_class": ""}, {"give_up": "  "}, {"status": ""}, {"endpoint": " "}]
)
def test_a_group_with_an_empty_filter_is_refused(values: dict[str, Any]) -> None:
    """An empty value would select nothing while the group read "any": refused; None is
    the "any" a group means."""
    with pytest.raises(UsageError, match="is empty"):
        Group(**values)
    assert Group().describe() == "error class any, give-up any, status any open"


NOW = datetime(2026, 12, 6, 8, 0, tzinfo=UTC)
CRM = "webhook:crm:expired:0f8fad5b-d9cb-469f-a165-70867728950e:1796404742793"


@pytest.mark.parametrize(
    ("group", "values", "holds"),
    [
        (Group(endpoint="crm"), {"message_id": CRM}, True),
        (Group(endpoint="cr"), {"message_id": CRM}, False),
        (Group(endpoint="crm:expired"), {"message_id": CRM}, False),
        (Group(endpoint="crm"), {"message_id": "expire:crm:1"}, False),
        (Group(endpoint="crm"), {"message_id": "webhook:crm:"}, False),
        (Group(since=NOW), {"last_seen": NOW}, True),
        (Group(since=NOW), {"last_seen": NOW - timedelta(seconds=1)}, False),
        (Group(until=NOW), {"last_seen": NOW}, False),
        (Group(until=NOW), {"last_seen": NOW - timedelta(seconds=1)}, True),
    ],
)
def test_a_group_holds_an_endpoints_dead_letters_and_its_window(
    group: Group, values: dict[str, Any], holds: bool
) -> None:
    """``--endpoint``: the dead letters ``webhook:<endpoint>:<event>`` of that endpoint
    alone (a name with ':' is no endpoint's); the window: ``since <= last_seen < until``."""
    assert group.holds(row(**values), "replay") is holds


def test_an_endpoints_group_holds_more_at_once_than_any_other() -> None:
    """One endpoint's dead deliveries: ENDPOINT_PLAN_LIMIT; any other group, and named
    dead letters: PLAN_LIMIT."""
    assert plans.limit_of(Selection(group=Group(endpoint="crm"))) == plans.ENDPOINT_PLAN_LIMIT
    assert plans.limit_of(Selection(group=Group(error_class="webhook.gone"))) == plans.PLAN_LIMIT
    assert plans.limit_of(Selection(keys=("7",))) == plans.PLAN_LIMIT
    described = Group(endpoint="crm", since=NOW).describe()
    assert described.endswith("endpoint crm, last dead-lettered from 2026-12-06T08:00:00+00:00")


@pytest.mark.parametrize(
    ("since", "until", "found"),
    [
        (None, None, (None, None)),
        ("6h", None, (NOW - timedelta(hours=6), None)),
        (None, "2h", (None, NOW - timedelta(hours=2))),
        ("2026-12-01", "3d", (datetime(2026, 12, 1, tzinfo=UTC), NOW - timedelta(days=3))),
    ],
)
def test_since_and_until_read_as_a_window_does(
    since: str | None, until: str | None, found: tuple[datetime | None, datetime | None]
) -> None:
    """ISO 8601 or how long ago; either may be left out (no bound on that side)."""
    assert plans.bounds(since, until, NOW) == found


@pytest.mark.parametrize(
    ("since", "until", "said"),
    [
        ("yesterday", None, "is not a time"),
        (None, "soon", "is not a time"),
        ("1h", "2h", "is not before --until"),
        ("2030-01-01", None, "is in the future"),
    ],
)
def test_a_window_that_is_none_is_refused_with_one_line(
    since: str | None, until: str | None, said: str
) -> None:
    """A TIME that is none, an empty window, a start to come: refused, one line."""
    with pytest.raises(UsageError, match=said) as refused:
        plans.bounds(since, until, NOW)
    assert "\n" not in str(refused.value)
