"""Dead letters a page at a time: a group's members read in one snapshot however many
they are, the members a plan does not list, and a page of a replay of webhook
deliveries' dead letters (claimed, revived, audited) in set-based statements.

A group is a status, an error class, a give-up reason, an endpoint (the dead letters
``webhook:<endpoint>:<event>`` of its deliveries) and a window on ``last_seen`` (when the
record was last dead-lettered, ``since <= last_seen < until``), each None for any. Its
members are read newest first, ``PAGE`` at a time (keyset, on the index
``(status, last_seen DESC, id DESC)``), all in one read-only repeatable-read
transaction: the listing is one snapshot, and its size is counted in it too. Each
statement of a replay's page takes at most ``PAGE`` records, so that no transaction is
large, whatever the selection.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from service.adapters.postgres.dead_letter_rows import REPLAYED_OUTCOMES, Actor
from service.adapters.postgres.pool import Connection, transaction
from service.adapters.postgres.revisions import REVISIONED

PAGE = 1000

# $1 statuses, $2 error class, $3 give-up, $4 endpoint, $5 since, $6 until (NULL: any).
# An endpoint's name has no ':' (one with it selects nothing, as the key's reading does).
MEMBERS = """
     status = ANY($1::text[])
 AND ($2::text IS NULL OR error_class = $2)
 AND ($3::text IS NULL OR give_up = $3)
 AND ($4::text IS NULL OR (strpos($4, ':') = 0
                           AND starts_with(message_id, 'webhook:' || $4 || ':')
                           AND length(message_id) > length($4) + 9))
 AND ($5::timestamptz IS NULL OR last_seen >= $5)
 AND ($6::timestamptz IS NULL OR last_seen < $6)
"""

# A page of the group, newest first, after the (last_seen, id) of the page before.
GROUP_PAGE = f"""
SELECT {REVISIONED}
  FROM dead_letters
 WHERE {MEMBERS}
   AND ($7::timestamptz IS NULL OR (last_seen, id) < ($7, $8::bigint))
 ORDER BY last_seen DESC, id DESC
 LIMIT $9
"""

GROUP_SIZE = f"SELECT count(*) FROM dead_letters WHERE {MEMBERS}"

# The members a plan ($7: its ids) does not list: at most $8 of them, and how many in all.
NOT_PLANNED = f"""
SELECT id, message_id, count(*) OVER () AS total
  FROM dead_letters d
 WHERE {MEMBERS}
   AND NOT EXISTS (SELECT FROM unnest($7::bigint[]) AS planned(id) WHERE planned.id = d.id)
 ORDER BY id
 LIMIT $8
"""

# The compare-and-set of ``revisions.CLAIM``, for a page: the records still at the
# revision their plan saw, each made a new revision (claimed).
CLAIM_PAGE = """
UPDATE dead_letters d SET status = d.status
  FROM unnest($1::bigint[], $2::text[]) AS planned(id, revision)
 WHERE d.id = planned.id AND d.xmin::text = planned.revision
RETURNING d.id
"""

# ``deliveries.REVIVE`` for a page: the dead deliveries due again, fresh attempts and age.
REVIVE_PAGE = """
UPDATE webhook_deliveries w
   SET dead = false, attempts = 0, since = now(), next_at = now(),
       lease_until = NULL, lease_token = NULL, origin = 'replay'
  FROM unnest($1::text[], $2::text[]) AS asked(endpoint, message_id)
 WHERE w.endpoint = asked.endpoint AND w.message_id = asked.message_id AND w.dead
RETURNING w.endpoint, w.message_id
"""

# ``dead_letter_rows.RECORD_REPLAY`` for a page (the database sets at and db_user).
RECORD_PAGE = """
INSERT INTO dead_letter_replays
       (dead_letter_id, message_id, operator, outcome, detail, os_user, client_host)
SELECT audited.id, audited.message_id, $5, audited.outcome, audited.detail, $6, $7
  FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[])
       AS audited(id, message_id, outcome, detail)
"""

MARK_PAGE = """
UPDATE dead_letters SET status = 'replayed', updated_at = now() WHERE id = ANY($1::bigint[])
"""

UNPARK_PAGE = "DELETE FROM parked_holds WHERE dead_letter_id = ANY($1::bigint[])"


@dataclass(frozen=True)
class Members:
    """Which dead letters a group holds (None: any)."""

    statuses: tuple[str, ...]
    error_class: str | None = None
    give_up: str | None = None
    endpoint: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def params(self) -> tuple[object, ...]:
        """$1 to $6 of ``MEMBERS``."""
        return (
            list(self.statuses),
            self.error_class,
            self.give_up,
            self.endpoint,
            self.since,
            self.until,
        )


@dataclass(frozen=True)
class Listed:
    """A group's members, newest first (at most the limit asked), and how many it has."""

    rows: list[asyncpg.Record]
    size: int


async def group(conn: Connection, members: Members, limit: int) -> Listed:
    """At most ``limit`` members of the group, newest first, read ``PAGE`` at a time in one
    snapshot (inside a transaction already open: in that one's)."""
    rows: list[asyncpg.Record] = []
    after: tuple[datetime | None, int | None] = (None, None)
    snapshot: contextlib.AbstractAsyncContextManager[None] = (
        contextlib.nullcontext()
        if conn.is_in_transaction()
        else transaction(conn, isolation="repeatable_read", readonly=True)
    )
    async with snapshot:
        while len(rows) < limit:
            size = min(PAGE, limit - len(rows))
            page = await conn.fetch(GROUP_PAGE, *members.params(), *after, size)
            rows += page
            if len(page) < size:
                return Listed(rows, len(rows))
            after = (page[-1]["last_seen"], page[-1]["id"])
        count: int = await conn.fetchval(GROUP_SIZE, *members.params())
    return Listed(rows, count)


async def not_planned(
    conn: Connection, members: Members, planned: Sequence[int], named: int
) -> tuple[list[asyncpg.Record], int]:
    """The group's members now that ``planned`` does not list: at most ``named`` of them
    (oldest record first), and how many there are."""
    rows = await conn.fetch(NOT_PLANNED, *members.params(), list(planned), named)
    return rows, int(rows[0]["total"]) if rows else 0


async def claim(conn: Connection, planned: Sequence[tuple[int, str]]) -> set[int]:
    """Claim the records (id, revision) still at their revision: the ids claimed."""
    rows = await conn.fetch(CLAIM_PAGE, [p[0] for p in planned], [p[1] for p in planned])
    return {row["id"] for row in rows}


async def revive(conn: Connection, wanted: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
    """Make the dead deliveries (endpoint, event message id) due again: those revived."""
    rows = await conn.fetch(REVIVE_PAGE, [w[0] for w in wanted], [w[1] for w in wanted])
    return {(row["endpoint"], row["message_id"]) for row in rows}


@dataclass(frozen=True)
class Audited:
    """One dead letter's replay (or refusal), as ``dead_letter_replays`` keeps it."""

    dead_letter_id: int
    message_id: str
    outcome: str
    detail: str


async def record_replays(conn: Connection, audited: Sequence[Audited], actor: Actor) -> None:
    """Audit each replay (or refusal) in one transaction; mark replayed, and unpark the
    holds of, those replayed (``REPLAYED_OUTCOMES``), as ``record_replay`` does one."""
    replayed = [a.dead_letter_id for a in audited if a.outcome in REPLAYED_OUTCOMES]
    async with transaction(conn):
        await conn.execute(
            RECORD_PAGE,
            [a.dead_letter_id for a in audited],
            [a.message_id for a in audited],
            [a.outcome for a in audited],
            [a.detail for a in audited],
            actor.operator,
            actor.os_user,
            actor.host,
        )
        if replayed:
            await conn.execute(MARK_PAGE, replayed)
            await conn.execute(UNPARK_PAGE, replayed)
