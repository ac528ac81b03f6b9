"""A replay's dry run saved as a file, and read back as the plan it showed.

``deadletters replay ... --dry-run --json`` prints the plan as data: what the
replay would do to each dead letter, each one's revision, the selection, and
when the dry run read them (the database's clock). ``replay --plan FILE``
reads it back and confirms exactly that plan (``plans.confirm``; one endpoint's
dead webhook deliveries a page at a time: ``plan_pages.replay``): what changed
since, or arrived since, is left out and named, as the console's confirmation
does. The file is untrusted input (it may have been edited, or made by
anyone): its size, its shape, every id, revision, filter and the time are
checked, and anything a dry run could not have made is refused with one line
(``UsageError``), before anything is selected.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

from service.core.errors import UsageError
from service.ops import plans
from service.ops.dead_letters import cell
from service.ops.replay import ReplayResult

# A plan of ENDPOINT_PLAN_LIMIT webhook deliveries' dead letters (about 300 bytes each),
# or of PLAN_LIMIT commands' with their details.
FILE_LIMIT = 64 * 1024 * 1024
ID_LIMIT = 10**18  # an id has at most 18 digits, as in a confirm form
BEYOND_LIMIT = 10**12
_REVISION = re.compile(r"^\d{1,10}$")
_GROUP_FILTERS = ("error_class", "give_up", "status", "endpoint")
_GROUP_TIMES = ("since", "until")
_STATUSES = (None, "dead", "closed")


def document(planned: plans.Plan, shown: list[ReplayResult]) -> dict[str, Any]:
    """The dry run as data: ``plan`` (what the replay would do to each dead letter, with
    its revision), ``beyond``, and what ``replay --plan`` needs besides: the act, the
    selection and when the dry run read the records."""
    revisions = {item.id: item.revision for item in planned.items}
    selection = planned.selection
    return {
        "plan": [{**r.as_json(), "revision": revisions[r.record_id]} for r in shown],
        "beyond": planned.beyond,
        "act": planned.act,
        "selection": (
            {"ids": list(selection.keys)}
            if selection.group is None
            else {"group": _group_document(selection.group)}
        ),
        "planned_at": planned.at.isoformat() if planned.at is not None else None,
    }


def _group_document(group: plans.Group) -> dict[str, str | None]:
    document = {name: getattr(group, name) for name in _GROUP_FILTERS}
    for name in _GROUP_TIMES:
        value = getattr(group, name)
        document[name] = value.isoformat() if value is not None else None
    return document


def read(path: str) -> plans.Plan:
    """The plan saved in ``path`` (at most FILE_LIMIT bytes), checked (``parse``)."""
    try:
        with Path(path).open("rb") as file:
            raw = file.read(FILE_LIMIT + 1)
    except OSError as exc:
        _refuse(f"cannot be read ({type(exc).__name__}: {cell(exc.strerror or exc)})")
    return parse(raw)


def parse(raw: bytes) -> plans.Plan:
    """The plan a saved dry run holds; ``UsageError`` (one line) for anything else."""
    if len(raw) > FILE_LIMIT:
        _refuse(f"is larger than {FILE_LIMIT // (1024 * 1024)} MiB: not one a dry run made")
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError:
        _refuse("is not UTF-8")
    except RecursionError:
        _refuse("is nested too deeply")
    except ValueError:
        _refuse("is not the JSON of replay --dry-run --json")
    document = _mapping(data, "the file")
    if document.get("act") != "replay":
        _refuse("is not a replay's plan (act)")
    selection = _selection(document.get("selection"))
    return plans.Plan(
        "replay",
        selection,
        _items(document.get("plan"), plans.limit_of(selection)),
        _count(document.get("beyond", 0), "beyond", BEYOND_LIMIT),
        _time(document.get("planned_at")),
    )


def _items(value: object, limit: int) -> tuple[plans.Planned, ...]:
    if not isinstance(value, list):
        _refuse("has no list of dead letters (plan)")
    if len(value) > limit:
        _refuse(f"lists more than {limit} dead letters")
    items = []
    for number, entry in enumerate(value):
        fields = _mapping(entry, f"plan[{number}]")
        record_id = _count(fields.get("id"), f"plan[{number}].id", ID_LIMIT)
        revision = fields.get("revision")
        if record_id < 1:
            _refuse(f"plan[{number}].id is not a record id")
        if not isinstance(revision, str) or not _REVISION.match(revision):
            _refuse(f"plan[{number}].revision is not a revision")
        items.append(plans.Planned(record_id, revision))
    if len({item.id for item in items}) != len(items):
        _refuse("lists a dead letter twice")
    return tuple(items)


def _selection(value: object) -> plans.Selection:
    selection = _mapping(value, "selection")
    if set(selection) == {"ids"}:
        keys = selection["ids"]
        if not isinstance(keys, list) or not keys or len(keys) > plans.PLAN_LIMIT:
            _refuse("selection.ids is not a list of dead letters")
        if not all(_name(key, plans.KEY_LIMIT) for key in keys):
            _refuse("selection.ids holds something that is not a record or message id")
        return plans.Selection(keys=tuple(dict.fromkeys(keys)))
    if set(selection) == {"group"}:
        return plans.Selection(group=_group(_mapping(selection["group"], "selection.group")))
    _refuse("selection names neither dead letters (ids) nor a group")


def _group(group: Mapping[str, Any]) -> plans.Group:
    if not set(group) <= {*_GROUP_FILTERS, *_GROUP_TIMES}:
        _refuse("selection.group filters by something a dry run does not")
    values = [group.get(name) for name in _GROUP_FILTERS]
    if not all(value is None or _name(value, plans.NAME_LIMIT) for value in values):
        _refuse("selection.group holds a filter that is not one a dry run made")
    if values[2] not in _STATUSES:
        _refuse("selection.group.status is not one a replay takes")
    error_class, give_up, status, endpoint = values
    since, until = (_bound(group.get(name), name) for name in _GROUP_TIMES)
    try:
        return plans.Group(error_class, give_up, status, endpoint, since, until)
    except UsageError:
        _refuse("selection.group's window is empty (since is not before until)")


def _time(value: object) -> datetime:
    if not isinstance(value, str) or not value:
        _refuse("does not say when its dry run was made (planned_at)")
    return _moment(value, "planned_at")


def _bound(value: object, what: str) -> datetime | None:
    """A group's ``since`` or ``until``: None (no bound) or a time with its offset."""
    if value is None:
        return None
    if not isinstance(value, str):
        _refuse(f"selection.group.{what} is not a time with its offset")
    return _moment(value, f"selection.group.{what}")


def _moment(value: str, what: str) -> datetime:
    try:
        found = plans.parse_time(value)
    except UsageError:
        found = None
    if found is None:
        _refuse(f"{what} is not a time with its offset")
    return found


def _mapping(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        _refuse(f"{what} is not a JSON object")
    return value


def _count(value: object, what: str, limit: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < limit:
        _refuse(f"{what} is not a whole number from 0 to {limit - 1}")
    return value


def _name(value: object, limit: int) -> bool:
    """A non-blank text of at most ``limit`` characters, none of them a control one."""
    return (
        isinstance(value, str)
        and bool(value.strip())
        and len(value) <= limit
        and value.isprintable()
    )


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def _refuse(why: str) -> NoReturn:
    raise UsageError(f"the plan file {why}: --plan takes what replay --dry-run --json printed")
