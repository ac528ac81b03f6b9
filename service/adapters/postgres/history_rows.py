"""History for late subscribers (migration 0018): the events the service still keeps in a
window (pending in ``expiry_events``, sent in ``expiry_events_sent``), queued again for
one webhook endpoint (a backfill) or read for a replay to one queue; and the audit of
each request (``history_requests``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from service.adapters.postgres.dead_letter_rows import Actor
from service.adapters.postgres.pool import Connection

# The events written in [$1, $2), pending (with their holds' deadlines) or sent (theirs
# read from the holds, which the service never deletes).
KEPT = """
SELECT reservation_id, message_id, hold_until, expired_at, created_at FROM expiry_events
 WHERE created_at >= $1 AND created_at < $2
UNION ALL
SELECT e.reservation_id, e.message_id, r.hold_until, e.expired_at, e.created_at
  FROM expiry_events_sent e JOIN reservations r ON r.id = e.reservation_id
 WHERE e.created_at >= $1 AND e.created_at < $2
"""

# A delivery of each to endpoint $3 (origin backfill), unless one waits already; the
# events found, and the deliveries queued.
BACKFILL = f"""
WITH kept AS ({KEPT}), queued AS (
    INSERT INTO webhook_deliveries (endpoint, message_id, reservation_id, hold_until,
                                    expired_at, origin)
    SELECT $3, message_id, reservation_id, hold_until, expired_at, 'backfill'
      FROM kept ORDER BY created_at
        ON CONFLICT (endpoint, message_id) DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM kept) AS found, (SELECT count(*) FROM queued) AS queued
"""

# All of them, oldest first (read through a cursor: one pass, whatever the window).
ORDERED = f"SELECT * FROM ({KEPT}) kept ORDER BY created_at, message_id"

# A backfill's one statement may read and write millions of rows: more time than a single
# update gets (in the caller's transaction only).
LONG_STATEMENT = "SET LOCAL statement_timeout = '30min'"

RECORD = """
INSERT INTO history_requests (kind, target, since, until, events, outcome, operator, os_user,
                              host)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
"""


@dataclass(frozen=True)
class KeptEvent:
    """An event the service keeps, as its message carries it."""

    reservation_id: UUID
    message_id: str
    hold_until: datetime
    expired_at: datetime
    created_at: datetime


@dataclass(frozen=True)
class Request:
    """One backfill or replay to a queue, as its audit keeps it."""

    kind: str  # backfill or replay-to
    target: str  # the endpoint or the queue
    since: datetime
    until: datetime
    events: int
    outcome: str  # done, or partial
    actor: Actor


async def backfill(
    conn: Connection, endpoint: str, since: datetime, until: datetime
) -> tuple[int, int]:
    """Queue every kept event written in the window for ``endpoint``, in the caller's
    transaction: (found, queued); an event whose delivery to it waits already is found and
    not queued again."""
    await conn.execute(LONG_STATEMENT)  # a window of months is one statement
    row = await conn.fetchrow(BACKFILL, since, until, endpoint)
    assert row is not None
    return row["found"], row["queued"]


async def kept(conn: Connection, since: datetime, until: datetime) -> AsyncIterator[KeptEvent]:
    """Every kept event of the window, oldest first, in one pass (a cursor: call it in a
    transaction)."""
    async for row in conn.cursor(ORDERED, since, until, prefetch=500):
        yield KeptEvent(**dict(row))


async def record(conn: Connection, request: Request) -> None:
    """The request, audited."""
    actor = request.actor
    await conn.execute(
        RECORD,
        request.kind,
        request.target,
        request.since,
        request.until,
        request.events,
        request.outcome,
        actor.operator,
        actor.os_user,
        actor.host,
    )
