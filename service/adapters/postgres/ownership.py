"""Dead letters as work: an owner, a note, closed without a replay or reopened, each act an
audited event; a closed dead letter's hold parked, so that the scan leaves it alone."""

from __future__ import annotations

import asyncpg

from service.adapters.postgres.dead_letter_rows import Actor
from service.adapters.postgres.pool import Connection, transaction

SET_OWNER = "UPDATE dead_letters SET owner = $2, updated_at = now() WHERE id = $1"
SET_NOTE = "UPDATE dead_letters SET note = $2, updated_at = now() WHERE id = $1"
# Only an open dead letter closes, only a closed one reopens; the row says which hold.
CLOSE = """
UPDATE dead_letters SET status = 'closed', updated_at = now()
 WHERE id = $1 AND status = 'dead'
RETURNING reservation_id
"""
REOPEN = """
UPDATE dead_letters SET status = 'dead', updated_at = now()
 WHERE id = $1 AND status = 'closed'
RETURNING reservation_id
"""
RECORD_EVENT = """
INSERT INTO dead_letter_events (dead_letter_id, kind, operator, detail, os_user, client_host)
VALUES ($1, $2, $3, $4, $5, $6)
"""
EVENTS_OF = """
SELECT kind, operator, at, detail, db_user, os_user, client_host
  FROM dead_letter_events WHERE dead_letter_id = $1 ORDER BY id
"""
# A hold the scan leaves alone (its reservation must exist: poison names none).
PARK = """
INSERT INTO parked_holds (reservation_id, dead_letter_id)
SELECT id, $2 FROM reservations WHERE id = $1
    ON CONFLICT (reservation_id) DO NOTHING
"""
UNPARK = "DELETE FROM parked_holds WHERE reservation_id = $1"
PARKED_COUNT = """
SELECT count(*) FROM parked_holds p JOIN reservations r ON r.id = p.reservation_id
 WHERE r.status = 'held'
"""


async def _event(
    conn: Connection, dead_letter_id: int, kind: str, actor: Actor, detail: str | None
) -> None:
    await conn.execute(
        RECORD_EVENT, dead_letter_id, kind, actor.operator, detail, actor.os_user, actor.host
    )


async def assign(conn: Connection, dead_letter_id: int, owner: str, actor: Actor) -> None:
    """Give the dead letter an owner (audited)."""
    async with transaction(conn):
        await conn.execute(SET_OWNER, dead_letter_id, owner)
        await _event(conn, dead_letter_id, "assigned", actor, owner)


async def note(conn: Connection, dead_letter_id: int, text: str, actor: Actor) -> None:
    """Set the dead letter's note (audited)."""
    async with transaction(conn):
        await conn.execute(SET_NOTE, dead_letter_id, text)
        await _event(conn, dead_letter_id, "noted", actor, text)


async def close(conn: Connection, dead_letter_id: int, reason: str, actor: Actor) -> bool:
    """Close an open dead letter without a replay and park its hold (audited); False if it
    was not open."""
    async with transaction(conn):
        row = await conn.fetchrow(CLOSE, dead_letter_id)
        if row is None:
            return False
        if row["reservation_id"] is not None:
            await conn.execute(PARK, row["reservation_id"], dead_letter_id)
        await _event(conn, dead_letter_id, "closed", actor, reason)
    return True


async def reopen(conn: Connection, dead_letter_id: int, reason: str, actor: Actor) -> bool:
    """Reopen a closed dead letter and unpark its hold (audited); False if it was not
    closed."""
    async with transaction(conn):
        row = await conn.fetchrow(REOPEN, dead_letter_id)
        if row is None:
            return False
        if row["reservation_id"] is not None:
            await conn.execute(UNPARK, row["reservation_id"])
        await _event(conn, dead_letter_id, "reopened", actor, reason)
    return True


async def events_of(conn: Connection, dead_letter_id: int) -> list[asyncpg.Record]:
    """Every assignment, note, closing and reopening of one dead letter."""
    return await conn.fetch(EVENTS_OF, dead_letter_id)


async def parked_count(conn: Connection) -> int:
    """Held holds the scan leaves alone (their dead letter closed)."""
    count: int = await conn.fetchval(PARKED_COUNT)
    return count
