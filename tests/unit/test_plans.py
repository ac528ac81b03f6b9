"""Unit tests for ``service/ops/plans.py``: a selection is never empty, a plan's form is
read strictly, and a planned record is acted on only as the dry run saw it."""

from __future__ import annotations

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
    found = plans._unfit(now, Planned(7, "100"), "replay", group, keys)
    assert (found is None) if why is None else (found is not None and why in found)


@pytest.mark.parametrize("values", [{"error_class": ""}, {"give_up": "  "}, {"status": ""}])
def test_a_group_with_an_empty_filter_is_refused(values: dict[str, str]) -> None:
    """An empty value would select nothing while the group read "any": refused; None is
    the "any" a group means."""
    with pytest.raises(UsageError, match="is empty"):
        Group(**values)
    assert Group().describe() == "error class any, give-up any, status any open"
