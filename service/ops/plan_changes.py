"""What changed in a planned dead letter since its dry run, for the line that leaves it out.

A record's revision (``adapters/postgres/revisions.py``) says only that it changed.
What changed, and who changed it, is in its audit trail: every act that changes a
record (an owner given, a note, a closing, a reopening, a replay) appends a row, in
the same transaction, to ``dead_letter_events`` or ``dead_letter_replays``. The acts
recorded at or after the moment the dry run read the record (``Plan.at``, the
database's clock) are those it did not see; a record dead-lettered again since says
so by its ``last_seen``. A change the trail does not explain (another confirmation
claimed the record, or the recorder wrote it again unchanged) is said to be such.
The console's form carries only ``id:revision`` pairs and the time (its size is
bounded), so the record's earlier values are read from the trail, not the plan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import asyncpg

from service.adapters import postgres
from service.adapters.postgres import ownership
from service.core.default_owners import DEFAULT_OPERATOR
from service.ops.dead_letters import cell

PREFIX = "changed since the dry run"
# The detail of an assignment by EXPIRY_DEAD_LETTER_OWNERS: "OWNER (error class matched P)".
_RULE_DETAIL = " (error class matched "

Row = asyncpg.Record | Mapping[str, Any]


async def explain(
    conn: postgres.Connection, since: datetime | None, rows: Sequence[Row]
) -> dict[int, str]:
    """Why each of ``rows`` (records as they are now, changed since a dry run that read
    them at ``since``) is left out, by record id."""
    said = {}
    for row in rows:
        events = await ownership.events_of(conn, row["id"]) if since is not None else []
        replays = await postgres.replays_of(conn, row["id"]) if since is not None else []
        said[row["id"]] = describe(row, since, events, replays)
    return said


def describe(
    row: Row, since: datetime | None, events: Sequence[Row], replays: Sequence[Row]
) -> str:
    """What changed in ``row`` since ``since``, from its events and replays (each in the
    order they were recorded): every act since, in order, and who did it."""
    if since is None:  # a plan that does not say when it was made
        return f"{PREFIX}: now {row['status']}"
    changes = [*_events_since(events, since), *_replays_since(replays, since)]
    if row["times_dead"] > 1 and row["last_seen"] >= since:
        changes.append(
            (row["last_seen"], f"dead-lettered again ({row['times_dead']} times in all)")
        )
    if not changes:
        return (
            f"{PREFIX} (nothing recorded since: another confirmation claimed it, or its "
            f"record was written again); now {row['status']}"
        )
    changes.sort(key=lambda change: change[0])
    return f"{PREFIX}: " + "; ".join(text for _at, text in changes)


def _events_since(events: Sequence[Row], since: datetime) -> list[tuple[datetime, str]]:
    """The owner, note, closing and reopening acts recorded since ``since``, each named; an
    owner change names the owner before it when the trail knows it."""
    found = []
    owner: str | None = None
    noted = False
    for event in events:
        kind, by = event["kind"], f"(by {cell(event['operator'])})"
        if kind == "assigned":
            before, owner = owner, _owner_of(event)
            text = (
                f"owner set to {cell(owner)} {by}"
                if before is None
                else f"owner changed from {cell(before)} to {cell(owner)} {by}"
            )
        elif kind == "noted":
            text, noted = f"note {'changed' if noted else 'added'} {by}", True
        else:
            text = f"{cell(kind)} {by}"
        if event["at"] >= since:
            found.append((event["at"], text))
    return found


def _owner_of(event: Row) -> str:
    """The owner an assignment gave: its detail (an automatic one's says why, after it)."""
    detail = str(event["detail"] or "")
    if event["operator"] == DEFAULT_OPERATOR and _RULE_DETAIL in detail:
        return detail.split(_RULE_DETAIL, 1)[0]
    return detail


def _replays_since(replays: Sequence[Row], since: datetime) -> list[tuple[datetime, str]]:
    """The replays since ``since`` that changed the record (republished, redelivering)."""
    return [
        (replay["at"], f"replayed (by {cell(replay['operator'])})")
        for replay in replays
        if replay["outcome"] in postgres.REPLAYED_OUTCOMES and replay["at"] >= since
    ]
