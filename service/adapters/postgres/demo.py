"""The demo's statements: the other systems' side (placing holds, consuming one at its
deadline with their own guarded update) and what a run shows and checks at the end."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from service.adapters.postgres.pool import Connection

PLACE_HOLDS = """
INSERT INTO reservations (id, hold_until)
SELECT gen_random_uuid(), now() + make_interval(secs => $2 + random() * $3)
  FROM generate_series(1, $1)
RETURNING id, hold_until
"""
# The support side's guarded update, as any other system runs it.
CONSUME_HOLD = """
UPDATE reservations SET status = 'consumed', updated_at = now()
 WHERE id = $1 AND status = 'held'
RETURNING id
"""
COUNT_RESERVATIONS = "SELECT count(*) FROM reservations"
PROGRESS = """
SELECT count(*) FILTER (WHERE status = 'held') AS held,
       count(*) FILTER (WHERE status = 'expired') AS expired,
       count(*) FILTER (WHERE status = 'consumed') AS consumed,
       count(*) FILTER (WHERE status = 'held' AND hold_until <= now()) AS due,
       coalesce(extract(epoch FROM now() - min(hold_until)
                FILTER (WHERE status = 'held' AND hold_until <= now())), 0)::float8 AS oldest_due
  FROM reservations
"""
FINAL_STATES = """
WITH t AS (SELECT reservation_id, count(*) AS n FROM reservation_transitions GROUP BY 1)
SELECT count(*) AS placed,
       count(*) FILTER (WHERE r.status = 'expired') AS expired,
       count(*) FILTER (WHERE r.status = 'consumed') AS consumed,
       count(*) FILTER (WHERE r.status = 'held') AS held,
       count(*) FILTER (WHERE r.status = 'held' AND r.hold_until <= now()) AS held_past_deadline,
       count(*) FILTER (WHERE r.status = 'expired' AND coalesce(t.n, 0) <> 1) AS expired_not_once,
       count(*) FILTER (WHERE r.status = 'consumed' AND coalesce(t.n, 0) > 0)
           AS consumed_with_transition,
       coalesce(min(t.n) FILTER (WHERE r.status = 'expired'), 0) AS min_transitions,
       coalesce(max(t.n) FILTER (WHERE r.status = 'expired'), 0) AS max_transitions
  FROM reservations r LEFT JOIN t ON t.reservation_id = r.id
"""
EXPIRY_LAG = """
SELECT coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY lag), 0)::float8 AS p50,
       coalesce(percentile_cont(0.95) WITHIN GROUP (ORDER BY lag), 0)::float8 AS p95,
       coalesce(max(lag), 0)::float8 AS max,
       coalesce(extract(epoch FROM max(at) - min(hold_until)), 0)::float8 AS window
  FROM (SELECT t.at, r.hold_until, extract(epoch FROM t.at - r.hold_until) AS lag
          FROM reservation_transitions t JOIN reservations r ON r.id = t.reservation_id
         WHERE t.to_status = 'expired') AS expiries
"""
EXPIRIES_BY_WORKER = (
    "SELECT worker, count(*) AS n FROM reservation_transitions GROUP BY 1 ORDER BY 1"
)


async def place_holds(
    conn: Connection, count: int, *, lead: float, spread: float
) -> list[tuple[UUID, datetime]]:
    """Insert ``count`` held reservations due ``lead`` to ``lead + spread`` seconds from now
    (the database's clock); their ids and deadlines."""
    rows = await conn.fetch(PLACE_HOLDS, count, lead, spread)
    return [(row["id"], row["hold_until"]) for row in rows]


async def consume_hold(conn: Connection, reservation_id: UUID) -> bool:
    """Consume a hold as another system does; False if it was no longer held."""
    return await conn.fetchval(CONSUME_HOLD, reservation_id) is not None


async def count_reservations(conn: Connection) -> int:
    """How many reservations there are, whatever their state."""
    count: int = await conn.fetchval(COUNT_RESERVATIONS)
    return count


async def _one_row(conn: Connection, statement: str) -> dict[str, Any]:
    row = await conn.fetchrow(statement)
    assert row is not None  # an aggregate always yields a row
    return dict(row.items())


async def progress(conn: Connection) -> dict[str, Any]:
    """Held (and due, and the oldest due's age), expired and consumed, right now."""
    return await _one_row(conn, PROGRESS)


async def final_states(conn: Connection) -> dict[str, int]:
    """Every count the demo's checks need: states, and transitions per expired hold."""
    return await _one_row(conn, FINAL_STATES)


async def expiry_lag(conn: Connection) -> dict[str, float]:
    """Deadline-to-expiry lag (median, p95, max) and the expiries' window, in seconds."""
    return await _one_row(conn, EXPIRY_LAG)


async def expiries_by_worker(conn: Connection) -> dict[str, int]:
    """Transitions written by each worker."""
    return {row["worker"]: row["n"] for row in await conn.fetch(EXPIRIES_BY_WORKER)}
