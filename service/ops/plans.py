"""What an act on dead letters acts on: the selection asked for, the plan its dry run shows,
and the confirmation, which acts on exactly the planned dead letters and no more.

A selection names dead letters (record ids or message ids) or a group (error
class, give-up reason, status, endpoint and a window on when each was last
dead-lettered, each of which may be "any"; an empty value, which would select
nothing while reading as "any", is refused); it is never empty, so a request
that selects nothing selects nothing. A group holds at most PLAN_LIMIT dead
letters at once; one endpoint's dead webhook deliveries (``--endpoint``), read
and replayed a page at a time (``plan_pages.py``), up to ENDPOINT_PLAN_LIMIT. A plan lists
each selected dead letter with its revision (``adapters/postgres/revisions.py``),
and when the dry run read them (the database's clock). Confirming a plan reads
those records again: one that changed since the dry run (named with what
changed: ``plan_changes.py``), or is gone, is left out, and so is every member
of the group that arrived since (a new dry run includes it). Each planned record
that is still as it was is then claimed, so that two confirmations of one plan
never both act. A plan travels as the console's confirm form (``token`` and the
time) or as a saved dry run (``plan_file.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from service.adapters import postgres
from service.adapters.postgres import dead_letter_pages, revisions
from service.core import webhook_policy, windows
from service.core.errors import UsageError
from service.ops import plan_changes
from service.ops.dead_letters import OPEN, cell

# The records each act applies to: an open dead letter is replayed, assigned, noted or
# closed; a closed one is also replayed, assigned or noted, and reopened.
STATUSES: dict[str, tuple[str, ...]] = {
    "replay": OPEN,
    "assign": OPEN,
    "note": OPEN,
    "close": ("dead",),
    "reopen": ("closed",),
}
PLAN_LIMIT = 1000
# One endpoint's dead webhook deliveries at once (a receiver's outage): read and replayed
# a page (dead_letter_pages.PAGE) at a time.
ENDPOINT_PLAN_LIMIT = 100_000
KEY_LIMIT = 300
NAME_LIMIT = 100
_ITEM = re.compile(r"^(\d{1,18}):(\d{1,10})$")
TIME_LIMIT = 64
FORGED = "the plan is not one a dry run made: dry-run again"


@dataclass(frozen=True)
class Group:
    """A group of dead letters: an error class, a give-up reason, a status, the endpoint of
    a webhook delivery's, and when it was last dead-lettered (``since <= last_seen <
    until``); None: any."""

    error_class: str | None = None
    give_up: str | None = None
    status: str | None = None
    endpoint: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def __post_init__(self) -> None:
        for what, value in (
            ("error class", self.error_class),
            ("give-up", self.give_up),
            ("status", self.status),
            ("endpoint", self.endpoint),
        ):
            if value is not None and not value.strip():
                raise UsageError(f"the group's {what} is empty: it would select nothing")
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise UsageError("the group's window is empty: since is not before until")

    def statuses(self, act: str) -> tuple[str, ...]:
        """The statuses the group covers for ``act``."""
        allowed = STATUSES[act]
        if self.status is None:
            return allowed
        return (self.status,) if self.status in allowed else ()

    def holds(self, row: asyncpg.Record | Mapping[str, Any], act: str) -> bool:
        """Whether the record belongs to the group, for ``act``."""
        key = webhook_policy.of_dead_letter_key(str(row["message_id"]))
        return (
            row["status"] in self.statuses(act)
            and self.error_class in (None, row["error_class"])
            and self.give_up in (None, row["give_up"])
            and (self.endpoint is None or (key is not None and key[0] == self.endpoint))
            and (self.since is None or row["last_seen"] >= self.since)
            and (self.until is None or row["last_seen"] < self.until)
        )

    def members(self, act: str) -> dead_letter_pages.Members:
        """The group, for ``act``, as the database selects it."""
        return dead_letter_pages.Members(
            self.statuses(act),
            self.error_class,
            self.give_up,
            self.endpoint,
            self.since,
            self.until,
        )

    def describe(self) -> str:
        """The group in words."""
        said = (
            f"error class {self.error_class or 'any'}, give-up {self.give_up or 'any'}, "
            f"status {self.status or 'any open'}"
        )
        if self.endpoint is not None:
            said += f", endpoint {cell(self.endpoint)}"
        if self.since is not None:
            said += f", last dead-lettered from {cell(self.since)}"
        if self.until is not None:
            said += f", last dead-lettered before {cell(self.until)}"
        return said


@dataclass(frozen=True)
class Selection:
    """Named dead letters, or a group: exactly one of the two."""

    keys: tuple[str, ...] = ()
    group: Group | None = None

    def __post_init__(self) -> None:
        if bool(self.keys) == (self.group is not None):
            raise UsageError(
                "nothing selected: name dead letters by id, or choose a group explicitly"
                if not self.keys
                else "name dead letters or a group, not both"
            )


@dataclass(frozen=True)
class Planned:
    """One dead letter of a plan, as its dry run saw it."""

    id: int
    revision: str


@dataclass(frozen=True)
class LeftOut:
    """A dead letter the confirmation did not act on, and why."""

    id: int
    message_id: str
    why: str

    def line(self) -> str:
        """One line of the report."""
        return f"left out #{self.id}  {cell(self.message_id)}  ({self.why})"


@dataclass(frozen=True)
class Plan:
    """What a dry run showed: the act, the selection, each record with its revision."""

    act: str
    selection: Selection
    items: tuple[Planned, ...]
    beyond: int = 0  # members of the group past PLAN_LIMIT, not in this plan
    at: datetime | None = None  # when the dry run read them (the database's clock)

    def token(self) -> str:
        """The items as the console's confirm form carries them: ``id:revision,...``."""
        return ",".join(f"{item.id}:{item.revision}" for item in self.items)


@dataclass
class Confirmed:
    """The records a confirmation acts on (claimed), and those it leaves out."""

    rows: list[asyncpg.Record] = field(default_factory=list)
    left_out: list[LeftOut] = field(default_factory=list)
    unnamed: int = 0  # newcomers left out past those named (counted only)

    def lines(self) -> list[str]:
        """The left-out ones, one line each (nothing when none)."""
        lines = [item.line() for item in self.left_out]
        if self.unnamed:
            lines.append(f"left out {self.unnamed} more that arrived since (not named)")
        return lines


def limit_of(selection: Selection) -> int:
    """The most dead letters a plan of ``selection`` holds: ENDPOINT_PLAN_LIMIT for one
    endpoint's (a group of webhook deliveries' dead letters alone), else PLAN_LIMIT."""
    group = selection.group
    return ENDPOINT_PLAN_LIMIT if group is not None and group.endpoint else PLAN_LIMIT


def bounds(
    since: str | None, until: str | None, now: datetime
) -> tuple[datetime | None, datetime | None]:
    """``--since`` and ``--until`` as ``core/windows.py`` reads a TIME (ISO 8601, or how
    long ago from ``now``); either may be left out (no bound on that side: a later
    newcomer is then named as such, not silently outside the window)."""
    try:
        start = None if since is None else windows.moment(since, now)
        end = None if until is None else windows.moment(until, now)
    except windows.NotATime as exc:
        raise UsageError(str(exc)) from None
    if start is not None and start > now:
        raise UsageError(f"--since ({cell(start)}) is in the future: it would select nothing")
    if start is not None and end is not None and start >= end:
        raise UsageError(f"--since ({cell(start)}) is not before --until ({cell(end)})")
    return start, end


def parse_items(token: str) -> tuple[Planned, ...]:
    """The items of a confirm form (untrusted): ``id:revision`` pairs, at most PLAN_LIMIT."""
    parts = [part for part in token.split(",") if part] if token else []
    if len(parts) > PLAN_LIMIT:
        raise UsageError(f"a plan holds at most {PLAN_LIMIT} dead letters")
    items = []
    for part in parts:
        match = _ITEM.match(part)
        if match is None:
            raise UsageError(FORGED)
        items.append(Planned(int(match.group(1)), match.group(2)))
    return tuple(dict.fromkeys(items))


def parse_time(text: str) -> datetime | None:
    """When a dry run read its records, as a confirm form carries it back (untrusted): ISO
    8601 with an offset; empty: not known."""
    if not text:
        return None
    try:
        found = datetime.fromisoformat(text) if len(text) <= TIME_LIMIT else None
    except ValueError:
        found = None
    if found is None or found.utcoffset() is None:
        raise UsageError(FORGED)
    return found


def keys_of(values: Iterable[str]) -> tuple[str, ...]:
    """Record ids or message ids as given (bounded, blanks dropped, each once)."""
    return tuple(dict.fromkeys(v.strip()[:KEY_LIMIT] for v in values if v.strip()))


async def plan(
    conn: postgres.Connection, act: str, selection: Selection, limit: int | None = None
) -> tuple[Plan, list[Any]]:
    """The dry run's plan and its records: the selected dead letters in a state to ``act``
    on, newest first (a group: at most ``limit``, never more than ``limit_of`` it, read in
    one snapshot with its size).

    Named dead letters that do not exist or are not in such a state are refused
    (``UsageError``), as one alone always was.
    """
    bound = limit_of(selection)
    limit = max(1, min(limit or bound, bound))
    at = await postgres.db_now(conn)  # before the read: an act recorded after it is news
    beyond = 0
    if selection.group is not None:
        listed = await dead_letter_pages.group(conn, selection.group.members(act), limit)
        rows, beyond = listed.rows, listed.size - len(listed.rows)
    else:
        rows = await select(conn, act, selection)
    items = tuple(Planned(row["id"], row["revision"]) for row in rows)
    return Plan(act, selection, items, max(0, beyond), at), rows


def plan_lines(planned: Plan, rows: list[Any]) -> list[str]:
    """The dry run of an act other than a replay: one line per dead letter, then the count."""
    lines = [
        f"would {planned.act:6} #{row['id']}  {cell(row['message_id'])}  "
        f"({cell(row['error_class'])}, {row['status']})"
        for row in rows
    ]
    return [*lines, *tail_lines(planned)]


def tail_lines(planned: Plan) -> list[str]:
    """What a plan leaves for later, and what it selected."""
    lines = []
    if planned.selection.group is not None:
        lines.append(f"group: {planned.selection.group.describe()}")
    if planned.beyond:
        lines.append(
            f"{planned.beyond} more of the group are not in this plan (at most "
            f"{len(planned.items)} at once): {planned.act} again afterwards"
        )
    if not planned.items:
        lines.append(f"nothing to {planned.act}")
    return lines


async def select(
    conn: postgres.Connection, act: str, selection: Selection, limit: int = PLAN_LIMIT
) -> list[Any]:
    """The records of ``selection`` in a state to ``act`` on, with their revisions."""
    group = selection.group
    if group is not None:
        return (await dead_letter_pages.group(conn, group.members(act), limit)).rows
    rows = await revisions.by_keys(conn, selection.keys)
    found = {str(row["id"]) for row in rows} | {row["message_id"] for row in rows}
    if missing := [key for key in selection.keys if key not in found]:
        raise UsageError(f"no dead letter {missing[0]!r} (give a record id or a message id)")
    if unfit := [row for row in rows if row["status"] not in STATUSES[act]]:
        row = unfit[0]
        raise UsageError(f"dead letter #{row['id']} is {row['status']}; nothing to {act}")
    return list(rows)


async def records_of(conn: postgres.Connection, planned: Plan) -> list[Any]:
    """The records a plan lists, as they are now (those that still exist)."""
    return await revisions.by_ids(conn, [item.id for item in planned.items])


async def confirm(conn: postgres.Connection, planned: Plan) -> Confirmed:
    """Claim each planned record still as the dry run saw it; name the rest (what changed
    in those that changed), and the group's newcomers (read now, not acted on)."""
    now = {row["id"]: row for row in await revisions.by_ids(conn, [i.id for i in planned.items])}
    keys = set(planned.selection.keys)
    group = planned.selection.group
    done = Confirmed()
    changed = []
    for item in planned.items:
        row = now.get(item.id)
        if row is not None and row["revision"] != item.revision:
            changed.append(row)
            continue
        why = unfit(row, item, planned.act, group, keys)
        if why is None and row is not None:
            claimed = await revisions.claim(conn, row["id"], item.revision)
            why = None if claimed else "changed while it was being confirmed"
        if why is not None:
            done.left_out.append(LeftOut(item.id, row["message_id"] if row else "-", why))
        elif row is not None:
            done.rows.append(row)
    said = await plan_changes.explain(conn, planned.at, changed)
    done.left_out += [LeftOut(row["id"], row["message_id"], said[row["id"]]) for row in changed]
    if group is not None:
        done.left_out += await _newcomers(conn, planned, group)
    return done


def unfit(
    row: asyncpg.Record | Mapping[str, Any] | None,
    item: Planned,
    act: str,
    group: Group | None,
    keys: set[str],
) -> str | None:
    """Why a planned record must be left out, or None."""
    if row is None:
        return "no longer exists"
    if row["revision"] != item.revision:
        return f"changed since the dry run: now {row['status']}"
    if group is not None and not group.holds(row, act):
        return "not in the group the dry run showed"
    if group is None and not keys & {str(row["id"]), row["message_id"]}:
        return "not one of the dead letters the dry run showed"
    return None


async def _newcomers(conn: postgres.Connection, planned: Plan, group: Group) -> list[LeftOut]:
    """The group's members now that the plan does not list: arrived (or, past the plan's
    limit, not listed) after the dry run."""
    planned_ids = {item.id for item in planned.items}
    why = f"not in the dry run: not {DONE[planned.act]}"
    why += (
        " (it arrived since, or was past the plan's limit)"
        if planned.beyond
        else " (it arrived since)"
    )
    rows = await select(conn, planned.act, Selection(group=group))
    return [LeftOut(r["id"], r["message_id"], why) for r in rows if r["id"] not in planned_ids]


DONE = {
    "replay": "replayed",
    "assign": "assigned",
    "note": "noted",
    "close": "closed",
    "reopen": "reopened",
}
