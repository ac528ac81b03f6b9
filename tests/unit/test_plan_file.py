"""Unit tests for ``service/ops/plan_file.py``: a dry run saved as JSON reads back as the
plan it showed, and a plan file, untrusted input, is refused with one line unless it is
one a dry run could have made."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from service.core.errors import UsageError
from service.ops import plan_file, plans, replay
from service.ops.plans import Group, Plan, Planned, Selection

AT = datetime(2026, 12, 3, 7, 24, 31, 123456, tzinfo=UTC)


def _group_plan() -> Plan:
    items = (Planned(7, "100"), Planned(9, "4"))
    group = Group(error_class="db.unavailable", give_up=None, status="dead")
    return Plan("replay", Selection(group=group), items, beyond=3, at=AT)


def _document(planned: Plan | None = None) -> dict[str, Any]:
    planned = planned or _group_plan()
    shown = [
        replay.ReplayResult(item.id, f"m-{item.id}", "would-republish", "it will expire")
        for item in planned.items
    ]
    return plan_file.document(planned, shown)


def test_a_saved_dry_run_reads_back_as_the_plan_it_showed() -> None:
    """Its items with their revisions, its selection (a group or named dead letters), how
    many it left for later and when the dry run read them: all as they were."""
    for planned in (
        _group_plan(),
        Plan("replay", Selection(keys=("7", "m-9")), (Planned(7, "100"),), at=AT),
    ):
        document = _document(planned)
        assert [entry["revision"] for entry in document["plan"]] == [
            item.revision for item in planned.items
        ]
        assert plan_file.parse(json.dumps(document).encode()) == planned


def test_a_plan_file_is_read_from_disk_within_its_bound(tmp_path: Path) -> None:
    """A file holding a dry run's JSON is read; a missing file or a directory is refused
    with one line."""
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(_document()))
    assert plan_file.read(str(path)) == _group_plan()
    for wrong in (tmp_path / "missing.json", tmp_path):
        with pytest.raises(UsageError, match="cannot be read") as refused:
            plan_file.read(str(wrong))
        assert "\n" not in str(refused.value)


def _changed(**changes: Any) -> bytes:
    """The document with top-level keys replaced (a value of ``...`` removes the key)."""
    document = _document()
    for key, value in changes.items():
        if value is ...:
            document.pop(key)
        else:
            document[key] = value
    return json.dumps(document).encode()


def _item(**changes: Any) -> bytes:
    entry = {**_document()["plan"][0], **changes}
    return _changed(plan=[entry])


BAD: list[tuple[str, bytes]] = [
    ("empty", b""),
    ("not UTF-8", b'{"plan": "\xff"}'),
    ("not JSON", b"plan: [7]"),
    ("a list", b"[]"),
    ("nested without end", b"[" * 100_000),
    ("NaN", _changed(beyond=float("nan"))),
    ("another act", _changed(act="close")),
    ("no act", _changed(act=...)),
    ("no items", _changed(plan=...)),
    ("items not a list", _changed(plan={"7": "100"})),
    ("an item not an object", _changed(plan=[[7, "100"]])),
    ("an id as text", _item(id="7")),
    ("an id true", _item(id=True)),
    ("an id zero", _item(id=0)),
    ("an id negative", _item(id=-7)),
    ("an id too large", _item(id=10**18)),
    ("an id fractional", _item(id=7.5)),
    ("no revision", _changed(plan=[{"id": 7}])),
    ("a revision as a number", _item(revision=100)),
    ("a revision not digits", _item(revision="10a")),
    ("a revision too long", _item(revision="1" * 11)),
    ("an id twice", _changed(plan=[{"id": 7, "revision": "1"}, {"id": 7, "revision": "2"}])),
    (
        "too many items",
        _changed(plan=[{"id": n, "revision": "1"} for n in range(1, plans.PLAN_LIMIT + 2)]),
    ),
    ("no selection", _changed(selection=...)),
    ("a selection of nothing", _changed(selection={})),
    ("ids and a group", _changed(selection={"ids": ["7"], "group": {}})),
    ("no ids", _changed(selection={"ids": []})),
    ("a blank id", _changed(selection={"ids": [" "]})),
    ("an id not text", _changed(selection={"ids": [7]})),
    ("an id too long", _changed(selection={"ids": ["x" * (plans.KEY_LIMIT + 1)]})),
    ("a group's blank class", _changed(selection={"group": {"error_class": ""}})),
    ("a group's class too long", _changed(selection={"group": {"give_up": "x" * 101}})),
    ("a group's status replayed", _changed(selection={"group": {"status": "replayed"}})),
    ("a group's unknown filter", _changed(selection={"group": {"worker": "w"}})),
    ("no time", _changed(planned_at=...)),
    ("a time without an offset", _changed(planned_at="2026-12-03T07:24:31")),
    ("not a time", _changed(planned_at="yesterday")),
    ("beyond negative", _changed(beyond=-1)),
    ("beyond as text", _changed(beyond="3")),
]


@pytest.mark.parametrize(("what", "raw"), BAD, ids=[what for what, _ in BAD])
def test_a_plan_file_not_made_by_a_dry_run_is_refused_with_one_line(what: str, raw: bytes) -> None:
    """Shape, sizes, ids, revisions, the selection and the time are all checked: anything
    else is refused (one line), so nothing is replayed from it."""
    with pytest.raises(UsageError, match="the plan file") as refused:
        plan_file.parse(raw)
    assert "\n" not in str(refused.value), what


def test_a_plan_file_over_its_size_is_refused_unread(tmp_path: Path) -> None:
    """A file larger than FILE_LIMIT is refused before it is parsed."""
    path = tmp_path / "huge.json"
    path.write_bytes(b" " * (plan_file.FILE_LIMIT + 1))
    with pytest.raises(UsageError, match="larger than"):
        plan_file.read(str(path))


def test_an_endpoints_plan_reads_back_past_the_limit_of_any_other() -> None:
    """A saved dry run of one endpoint's dead deliveries, with its window, reads back with
    more than PLAN_LIMIT dead letters (up to ENDPOINT_PLAN_LIMIT); the same list with any
    other selection is refused, and so is a window that is not a dry run's."""
    items = tuple(Planned(n, "1") for n in range(1, plans.PLAN_LIMIT + 201))
    group = Group(endpoint="crm", since=AT, until=None)
    planned = Plan("replay", Selection(group=group), items, at=AT)
    document = _document(planned)
    assert document["selection"]["group"]["since"] == AT.isoformat()
    assert plan_file.parse(json.dumps(document).encode()) == planned
    other = {**document, "selection": {"group": {"error_class": "webhook.unavailable"}}}
    with pytest.raises(UsageError, match=f"more than {plans.PLAN_LIMIT}"):
        plan_file.parse(json.dumps(other).encode())
    for window in ({"since": "2026-12-03"}, {"until": 7}, {"since": "x"}):
        forged = {**document, "selection": {"group": {"endpoint": "crm", **window}}}
        with pytest.raises(UsageError, match="is not a time with its offset"):
            plan_file.parse(json.dumps(forged).encode())
    empty = {"endpoint": "crm", "since": AT.isoformat(), "until": AT.isoformat()}
    with pytest.raises(UsageError, match="window is empty"):
        plan_file.parse(json.dumps({**document, "selection": {"group": empty}}).encode())
