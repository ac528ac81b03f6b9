"""Dead letters as an operator workflow: list, show, choose what to replay, and who may.

Dead letters are not a trash can: each has a record (``dead_letters``), and
each replay is an explicit, audited act by a named operator
(``dead_letter_replays``); the replay itself is ``service/ops/replay.py``'s.
Records hold sender-made text: every value is shown through ``cell``, which
never lets a control character through.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from service.adapters import postgres
from service.adapters.postgres import dead_letter_pages, ownership
from service.core import recorded_policy, webhook_policy
from service.core.errors import UsageError
from service.core.inputs import clean_text
from service.settings import OPERATOR_LIMIT, Settings

log = logging.getLogger("service.deadletters")

CELL_LIMIT = 1000
LIST_COLUMNS = (
    "id",
    "last_seen",
    "error_class",
    "give_up",
    "attempts",
    "reservation_id",
    "status",
    "owner",
)
TRANSITION_COLUMNS = ("at", "from_status", "to_status", "attempt", "worker", "message_id")
REPLAY_COLUMNS = ("at", "operator", "db_user", "os_user", "client_host", "outcome", "detail")
EVENT_COLUMNS = ("at", "kind", "operator", "db_user", "os_user", "client_host", "detail")
# Open: not replayed yet (a closed one may still be replayed or reopened).
OPEN = ("dead", "closed")
# The operator a replay refused for want of --operator is audited as: empty, which no
# --operator can give (a blank name is refused), shown as UNNAMED_SHOWN.
UNNAMED = ""
UNNAMED_SHOWN = "(none given)"
NEEDS_OPERATOR = "this needs --operator NAME: every act is audited with who did it"
# What replaying a webhook delivery's dead letter does, whatever became of its hold.
REDELIVERS = "sent again with the same webhook-id"


def cell(value: Any) -> str:
    """A value as shown: never a control character (records hold sender-made text)."""
    if value is None:
        return "-"
    if hasattr(value, "isoformat"):
        return str(value.isoformat(timespec="seconds"))
    return clean_text(str(value), CELL_LIMIT)


def render_table(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    """A plain, aligned text table."""
    cells = [[cell(row.get(column)) for column in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(line.rstrip() for line in lines)


def jsonable(row: Mapping[str, Any]) -> dict[str, Any]:
    """A record for machine output: numbers, booleans and None as they are, everything
    else (times, ids, text) shown as ``cell`` shows it."""
    return {key: json_value(value) for key, value in row.items()}


def json_value(value: Any) -> Any:
    """One value for machine output (see ``jsonable``)."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, Mapping):
        return jsonable(value)
    if isinstance(value, list | tuple):
        return [json_value(item) for item in value]
    return cell(value)


# -- list and show --------------------------------------------------------------


@dataclass(frozen=True)
class Filters:
    """Which dead letters to list (ages in seconds since last seen)."""

    status: str | None = "dead"  # None: any
    error_class: str | None = None
    older_than: float | None = None
    newer_than: float | None = None
    limit: int = 100


async def list_records(conn: postgres.Connection, filters: Filters) -> list[dict[str, Any]]:
    """The matching records, newest first."""
    rows = await postgres.list_dead_letters(
        conn,
        status=filters.status,
        error_class=filters.error_class,
        older_than=filters.older_than,
        newer_than=filters.newer_than,
        limit=filters.limit,
    )
    return [dict(row) for row in rows]


def list_lines(records: list[dict[str, Any]]) -> list[str]:
    """The listing as a table, with what to do next."""
    if not records:
        return ["no dead letters match"]
    return [
        render_table(records, LIST_COLUMNS),
        "",
        f"{len(records)} dead letter(s); details: show ID; retry: replay ID --operator NAME",
    ]


@dataclass
class Detail:
    """Everything known about one dead letter."""

    record: dict[str, Any]
    policy: recorded_policy.Policy | None = None  # the retry policy it was recorded under
    policy_changes: list[str] = field(default_factory=list)  # today's, compared with it
    transitions: list[dict[str, Any]] = field(default_factory=list)
    replays: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)  # assigned, noted, closed...

    def as_json(self) -> dict[str, Any]:
        """The machine form."""
        out = {**jsonable(self.record), "transitions": [jsonable(t) for t in self.transitions]}
        out["policy"] = json.loads(self.policy.as_json()) if self.policy else None
        out["policy_changes"] = list(self.policy_changes)
        out["replays"] = [jsonable(r) for r in self.replays]
        out["events"] = [jsonable(e) for e in self.events]
        return out

    def lines(self) -> list[str]:
        """The record, one field a line, then its audit trail and its replays."""
        width = max(len(k) for k in self.record)
        shown = {**self.record, "policy": recorded_policy.describe(self.policy)}
        lines = [f"{key.ljust(width)}  {cell(value)}" for key, value in shown.items()]
        lines += ["", "retry policy now, against the one it was dead-lettered under:"]
        lines += [f"  {line}" for line in self.policy_changes] or ["  the same"]
        lines += ["", "transitions (audit trail):"]
        lines.append(
            render_table(self.transitions, TRANSITION_COLUMNS) if self.transitions else "  none"
        )
        lines += ["", "replays:"]
        replays = [{**r, "operator": shown_operator(r.get("operator"))} for r in self.replays]
        lines.append(render_table(replays, REPLAY_COLUMNS) if replays else "  none")
        lines += ["", "owner, notes, closing (audit):"]
        lines.append(render_table(self.events, EVENT_COLUMNS) if self.events else "  none")
        return lines


async def read_detail(conn: postgres.Connection, key: str, settings: Settings) -> Detail | None:
    """The dead letter with record id or message id ``key``, or None."""
    row = await postgres.get_dead_letter(conn, key)
    if row is None:
        return None
    reservation_id = row["reservation_id"]
    record = {k: v for k, v in row.items() if k != "policy"}
    detail = Detail(record, recorded_policy.Policy.from_json(row["policy"]))
    current = recorded_policy.policy_in_force(settings)
    detail.policy_changes = recorded_policy.changes_for_record(dict(row), current)
    if reservation_id:
        detail.transitions = [dict(t) for t in await postgres.transitions_of(conn, reservation_id)]
        state = await postgres.reservation_state(conn, reservation_id)
    else:
        state = None
    detail.replays = [dict(r) for r in await postgres.replays_of(conn, row["id"])]
    detail.events = [dict(e) for e in await ownership.events_of(conn, row["id"])]
    detail.record["reservation_status"] = state[0] if state else None
    return detail


def shown_operator(operator: object) -> object:
    """An audit row's operator as shown: UNNAMED_SHOWN for one refused without a name."""
    return UNNAMED_SHOWN if operator == UNNAMED else operator


def filter_value(value: str | None, option: str) -> str | None:
    """A filter as given (``None``: not given, any); an empty or blank one, which would
    select nothing while reading as "any", is refused."""
    if value is None:
        return None
    if not value.strip():
        raise UsageError(f"{option} is empty: give a value, or leave it out for any")
    return value.strip()


def not_found(key: str) -> str:
    """What to say when no dead letter has this id."""
    return f"no dead letter {key!r} (give a record id or a message id)"


# -- what to replay, what it will do, who may ------------------------------------------


async def expectation(conn: postgres.Connection, row: asyncpg.Record | Mapping[str, Any]) -> str:
    """What replaying this dead letter will do, from the reservation's state now (a
    webhook delivery's: it is sent again)."""
    if is_delivery(row):
        return REDELIVERS
    if row["reservation_id"] is None:
        return "the body is unusable: it will be dead-lettered again"
    state = await postgres.reservation_state(conn, row["reservation_id"])
    if state is None:
        return "the reservation does not exist: it will be dead-lettered again"
    status, due = state
    if status == "held" and due:
        return "the hold is held and due: it will expire"
    return f"the hold is {status}{'' if due else ' and not due'}: a harmless no-op"


async def expectations(
    conn: postgres.Connection, rows: list[asyncpg.Record], settings: Settings
) -> dict[int, str]:
    """What replaying each row will do (``expectation``), and what today's retry policy
    changes from the one it was dead-lettered under (a command's: a webhook delivery is
    not retried under it), by record id."""
    current = recorded_policy.policy_in_force(settings)
    found = {}
    for row in rows:
        said = await expectation(conn, row)
        changed = [] if is_delivery(row) else recorded_policy.changes_for_record(dict(row), current)
        if changed:
            said += "; retry policy since it was dead-lettered: " + "; ".join(changed)
        found[row["id"]] = said
    return found


def is_delivery(row: asyncpg.Record | Mapping[str, Any]) -> bool:
    """Whether the record is a webhook delivery's dead letter (else a command's)."""
    return webhook_policy.of_dead_letter_key(str(row["message_id"])) is not None


def actor_named(operator: str | None) -> postgres.Actor:
    """Who replays: the ``--operator`` name, the OS user and this host."""
    name = clean_text((operator or "").strip(), OPERATOR_LIMIT)
    if not name:
        raise UsageError(NEEDS_OPERATOR)
    return postgres.Actor(name, clean_text(os_user(), OPERATOR_LIMIT), socket.gethostname())


def unnamed_actor() -> postgres.Actor:
    """Who asked for a replay without --operator, for the audit of its refusal: no name
    (UNNAMED), the OS user and this host."""
    return postgres.Actor(UNNAMED, clean_text(os_user(), OPERATOR_LIMIT), socket.gethostname())


def os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container's arbitrary uid)
        return f"uid {os.getuid()}"


def refusal(settings: Settings, actor: postgres.Actor, doing: str = "replay") -> str | None:
    """Why ``actor`` may not replay, close or reopen (``EXPIRY_REPLAY_OPERATORS``), or None."""
    if not settings.replay_operators:
        return f"nobody may {doing}: EXPIRY_REPLAY_OPERATORS names no operator"
    if actor.operator not in settings.replay_operators:
        return f"{actor.operator!r} may not {doing} (not in EXPIRY_REPLAY_OPERATORS)"
    return None


async def refuse(
    conn: postgres.Connection, actor: postgres.Actor, rows: list[asyncpg.Record], why: str
) -> None:
    """Audit the refusal for every selected dead letter (a page at a time), then raise
    ``UsageError(why)``."""
    for start in range(0, len(rows), dead_letter_pages.PAGE):
        page = rows[start : start + dead_letter_pages.PAGE]
        refused = [
            dead_letter_pages.Audited(r["id"], r["message_id"], "refused", why) for r in page
        ]
        await dead_letter_pages.record_replays(conn, refused, actor)
    log.warning("deadletter.replay_refused", extra={"operator": actor.operator, "reason": why})
    raise UsageError(why)


# -- owner, note, close, reopen --------------------------------------------------------

# Who may do what: assigning and noting need only a named operator (audited);
# closing and reopening, like a replay, one of EXPIRY_REPLAY_OPERATORS.
GUARDED = ("close", "reopen")
TEXT_LIMIT = 500


@dataclass(frozen=True)
class ActResult:
    """What one act did to one dead letter."""

    record_id: int
    message_id: str
    outcome: str  # assigned, noted, closed, reopened, skipped

    def line(self) -> str:
        """One line of the report."""
        return f"{self.outcome:9} #{self.record_id}  {cell(self.message_id)}"


async def act(
    conn: postgres.Connection,
    settings: Settings,
    actor: postgres.Actor,
    rows: list[asyncpg.Record],
    action: str,
    text: str,
) -> list[ActResult]:
    """Assign (``text``: the owner), note, close or reopen (``text``: why) each row."""
    if action in GUARDED and (why := refusal(settings, actor, action)) is not None:
        log.warning("deadletter.act_refused", extra={"operator": actor.operator, "act": action})
        raise UsageError(why)
    text = clean_text(text.strip(), TEXT_LIMIT)
    if not text:
        raise UsageError(f"{action} needs a text (an owner, a note or a reason)")
    results = []
    for row in rows:
        results.append(await _act_one(conn, row, action, text, actor))
    log.info(
        "deadletter.act",
        extra={"operator": actor.operator, "act": action, "count": len(results)},
    )
    return results


async def _act_one(
    conn: postgres.Connection, row: asyncpg.Record, action: str, text: str, actor: postgres.Actor
) -> ActResult:
    done = {"assign": "assigned", "note": "noted", "close": "closed", "reopen": "reopened"}
    if action == "assign":
        await ownership.assign(conn, row["id"], text, actor)
    elif action == "note":
        await ownership.note(conn, row["id"], text, actor)
    elif action == "close":
        if not await ownership.close(conn, row["id"], text, actor):
            return ActResult(row["id"], row["message_id"], "skipped")
    elif not await ownership.reopen(conn, row["id"], text, actor):
        return ActResult(row["id"], row["message_id"], "skipped")
    return ActResult(row["id"], row["message_id"], done[action])


def act_lines(results: list[ActResult], action: str) -> list[str]:
    """One line per dead letter, then the counts."""
    done = sum(r.outcome != "skipped" for r in results)
    skipped = len(results) - done
    tail = f", {skipped} skipped (not in a state to {action})" if skipped else ""
    return [*(r.line() for r in results), f"{action}: {len(results)} selected, {done} done{tail}"]
