"""Every SQL statement the benchmark runs in its own database, one function each."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias
from uuid import UUID

import asyncpg

if TYPE_CHECKING:  # the stubs make it generic; the runtime class is not
    Connection: TypeAlias = asyncpg.Connection[asyncpg.Record]
else:
    Connection = asyncpg.Connection

# The audit tables refuse TRUNCATE even to their owner (migrations 0005, 0013: each
# weekly partition too); the benchmark's database is its own, and its user a superuser, so
# its reset lifts every trigger for one transaction. CASCADE: the tables that refer to
# these (leases, transitions, parked holds) too; the outbox and its record, the webhooks'
# deliveries and their endpoints (no foreign key to the holds) by name: no endpoint stays
# registered for the next run.
RESET = """
BEGIN;
SET LOCAL session_replication_role = replica;
TRUNCATE reservations, dead_letters, dead_letter_replays, dead_letter_events, expiry_events,
         expiry_events_sent, webhook_deliveries, webhook_attempts, webhook_endpoints CASCADE;
COMMIT;
"""

# Due holds: every deadline just past (distinct, so that the scan's keyset order is total).
INSERT_DUE = """
INSERT INTO reservations (id, hold_until)
SELECT gen_random_uuid(), now() - interval '1 second' + g * interval '1 microsecond'
  FROM generate_series(1, $1) AS g
"""

# Holds coming due at a steady rate: $3 per second, from $2 seconds after now().
INSERT_SPREAD = """
INSERT INTO reservations (id, hold_until)
SELECT gen_random_uuid(), now() + make_interval(secs => $2 + (g - 1) / $3::float8)
  FROM generate_series(1, $1) AS g
"""

EXPIRED_COUNT = "SELECT count(*) FROM reservation_transitions WHERE to_status = 'expired'"

# Throughput: expirations over the time from the first to the last transition.
EXPIRED_WINDOW = """
SELECT count(*) AS n, coalesce(extract(epoch FROM max(at) - min(at)), 0)::float8 AS seconds
  FROM reservation_transitions WHERE to_status = 'expired'
"""

# How far apart the consumers made their first expiry (they start as separate processes).
START_SPREAD = """
SELECT coalesce(extract(epoch FROM max(first) - min(first)), 0)::float8
  FROM (SELECT min(at) AS first FROM reservation_transitions
         WHERE to_status = 'expired' GROUP BY worker) AS workers
"""

# Deadline to expired, by the database's clock (``at`` is the transaction's now()).
LAG = """
SELECT count(*) AS n,
       coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY lag), 0)::float8 AS p50,
       coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY lag), 0)::float8 AS p99,
       coalesce(max(lag), 0)::float8 AS max,
       coalesce(extract(epoch FROM max(at) - min(hold_until)), 0)::float8 AS seconds
  FROM (SELECT t.at, r.hold_until, extract(epoch FROM t.at - r.hold_until)::float8 AS lag
          FROM reservation_transitions t JOIN reservations r ON r.id = t.reservation_id
         WHERE t.to_status = 'expired') AS expiries
"""

DUE_COMMANDS = """
SELECT id, 'expire:' || id::text || ':' || round(extract(epoch FROM hold_until) * 1000)::text
       AS message_id
  FROM reservations
 WHERE status = 'held' AND hold_until <= now()
 ORDER BY hold_until, id
"""

# The batched guarded update and its audit rows, in one statement (one transaction).
BATCH_EXPIRE = """
WITH expired AS (
    UPDATE reservations
       SET status = 'expired', updated_at = now()
      FROM unnest($1::uuid[], $2::text[]) AS b (id, message_id)
     WHERE reservations.id = b.id AND status = 'held' AND hold_until <= now()
 RETURNING reservations.id, b.message_id
), audit AS (
    INSERT INTO reservation_transitions
           (reservation_id, from_status, to_status, message_id, attempt, worker)
    SELECT id, 'held', 'expired', message_id, 1, $3 FROM expired
)
SELECT count(*) FROM expired
"""


# Expirations of the holds not in $1, from the first to the last.
EXPIRED_WINDOW_EXCEPT = """
SELECT count(*) AS n, coalesce(extract(epoch FROM max(at) - min(at)), 0)::float8 AS seconds
  FROM reservation_transitions WHERE to_status = 'expired' AND reservation_id <> ALL($1::uuid[])
"""

# A random share of the held reservations, row-locked by the caller's transaction.
LOCK_SOME = """
SELECT id FROM reservations
 WHERE id IN (SELECT id FROM reservations WHERE status = 'held' ORDER BY random() LIMIT $1)
   FOR UPDATE
"""


async def reset(conn: Connection) -> None:
    """Empty every table the service writes."""
    await conn.execute(RESET)


async def insert_due(conn: Connection, count: int) -> None:
    """``count`` held reservations, all due."""
    await conn.execute(INSERT_DUE, count)
    await conn.execute("ANALYZE reservations")


async def insert_spread(conn: Connection, count: int, *, lead: float, rate: int) -> None:
    """``count`` held reservations coming due at ``rate`` per second from ``lead`` s on."""
    await conn.execute(INSERT_SPREAD, count, lead, rate)
    await conn.execute("ANALYZE reservations")


async def expired_count(conn: Connection) -> int:
    """Expiring transitions so far."""
    value: int = await conn.fetchval(EXPIRED_COUNT)
    return value


@dataclass(frozen=True)
class Window:
    """How many expired, between the first and the last transition."""

    expired: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.expired / self.seconds if self.seconds > 0 else 0.0


async def expired_window(conn: Connection) -> Window:
    """The expirations and the time from the first to the last one."""
    row = await conn.fetchrow(EXPIRED_WINDOW)
    assert row is not None
    return Window(row["n"], row["seconds"])


async def expired_window_except(conn: Connection, ids: list[UUID]) -> Window:
    """The expirations of every hold but ``ids``, and the time from the first to the last."""
    row = await conn.fetchrow(EXPIRED_WINDOW_EXCEPT, ids)
    assert row is not None
    return Window(row["n"], row["seconds"])


async def lock_some(conn: Connection, count: int) -> list[UUID]:
    """Row-lock ``count`` random held reservations in ``conn``'s open transaction."""
    return [row["id"] for row in await conn.fetch(LOCK_SOME, count)]


async def start_spread(conn: Connection) -> float:
    """Seconds between the first consumer's first expiry and the last consumer's."""
    value: float = await conn.fetchval(START_SPREAD)
    return value


@dataclass(frozen=True)
class Lag:
    """Deadline to expired (database clock), over every expired hold."""

    expired: int
    p50: float
    p99: float
    max: float
    seconds: float  # from the first deadline to the last expiry


async def lag(conn: Connection) -> Lag:
    """Lag percentiles of every expired hold."""
    row = await conn.fetchrow(LAG)
    assert row is not None
    return Lag(row["n"], row["p50"], row["p99"], row["max"], row["seconds"])


async def batch_expire(conn: Connection, *, batch_size: int, worker: str) -> tuple[int, float]:
    """Expire every due hold, ``batch_size`` per statement; (rows, seconds) of the updates."""
    rows = await conn.fetch(DUE_COMMANDS)
    ids: list[UUID] = [row["id"] for row in rows]
    message_ids: list[str] = [row["message_id"] for row in rows]
    expired = 0
    started = time.perf_counter()
    for start in range(0, len(ids), batch_size):
        end = start + batch_size
        count: int = await conn.fetchval(
            BATCH_EXPIRE, ids[start:end], message_ids[start:end], worker
        )
        expired += count
    return expired, time.perf_counter() - started
