"""The benchmark's SQL on the outbox (``expiry_events``, migration 0014_events) and its
record (``expiry_events_sent``), one function each: the trigger switched off and on for
the "events off" runs, events written straight into the outbox (as the owner), what is
pending, the relay's rate from its marks, commit to mark, and the table's own figures.

The relay marks a batch sent in one transaction (``expiry_events_sent.at`` is that
transaction's ``now()``, right after the batch's confirms), so the rows of one ``at`` are
one batch. Its rate over a stretch is the events of every batch but the first over the
time from the first mark to the last: the first batch's events were published before
the stretch began.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg

from bench.db import Connection

TRIGGER = "expiry_events_of_expiries"
# As the owner, in the benchmark's own database only; never in the service.
DISABLE_TRIGGER = f"ALTER TABLE reservation_transitions DISABLE TRIGGER {TRIGGER}"
ENABLE_TRIGGER = f"ALTER TABLE reservation_transitions ENABLE TRIGGER {TRIGGER}"
TRIGGER_ENABLED = f"""
SELECT tgenabled <> 'D' FROM pg_trigger
 WHERE tgname = '{TRIGGER}' AND tgrelid = 'reservation_transitions'::regclass
"""

# Events that no expiry wrote, as the trigger writes them (a hold due now, expired now):
# what the relay then publishes is what it publishes for a real expiry.
INSERT_EVENTS = """
INSERT INTO expiry_events (reservation_id, hold_until, expired_at, message_id)
SELECT id, at, at, 'expired:' || id::text || ':' || round(extract(epoch FROM at) * 1000)::text
  FROM (SELECT gen_random_uuid() AS id, now() AS at FROM generate_series(1, $1)) AS made
"""

PENDING = "SELECT count(*) FROM expiry_events"
SENT = "SELECT count(*) FROM expiry_events_sent"
LAST_MARK = "SELECT max(at) FROM expiry_events_sent"
# The mark that sent the $1-th event (the relay claims the oldest first: events written
# ahead, before any expiry's, are the first $1 it sends).
MARK_OF_NTH = """
SELECT at FROM (SELECT at, sum(count(*)) OVER (ORDER BY at) AS total
                  FROM expiry_events_sent GROUP BY at) AS marks
 WHERE total >= $1 ORDER BY at LIMIT 1
"""

# The relay's marks (one per batch) between two moments of the database's clock.
MARKS = """
SELECT at, count(*)::int AS n FROM expiry_events_sent
 WHERE at >= $1 AND at <= $2 GROUP BY at ORDER BY at
"""

# When the expiries of the run began and ended (transitions: the database's clock).
EXPIRIES_SPAN = """
SELECT min(at) AS first, max(at) AS last FROM reservation_transitions
 WHERE to_status = 'expired'
"""

# From each expiry's commit (its transaction's time, expired_at) to its event's mark.
COMMIT_TO_MARK = """
SELECT count(*)::int AS n,
       coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY d), 0)::float8 AS p50,
       coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY d), 0)::float8 AS p99,
       coalesce(max(d), 0)::float8 AS max
  FROM (SELECT extract(epoch FROM at - expired_at)::float8 AS d FROM expiry_events_sent) AS s
"""

# The outbox on disk and in the statistics collector (dead tuples, autovacuum's runs).
TABLE_FIGURES = """
SELECT pg_total_relation_size('expiry_events')::bigint AS bytes,
       pg_relation_size('expiry_events')::bigint AS heap_bytes,
       s.n_live_tup::bigint AS live, s.n_dead_tup::bigint AS dead,
       s.autovacuum_count::int AS autovacuums, s.vacuum_count::int AS vacuums,
       (SELECT coalesce(sum(pg_total_relation_size(relid)), 0)
          FROM pg_partition_tree('expiry_events_sent'))::bigint AS sent_bytes
  FROM pg_stat_user_tables s WHERE s.relname = 'expiry_events'
"""


# Exact, by reading the whole table (pgstattuple, a contrib extension: created by the
# benchmark in its own database); the statistics above lag by up to the server's flush.
EXACT = "SELECT tuple_count, dead_tuple_count FROM pgstattuple('expiry_events')"


async def exact_tuples(conn: Connection) -> tuple[int, int] | None:
    """(live, dead) tuples of the outbox, read from the table itself; None without the
    pgstattuple extension."""
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
    except asyncpg.PostgresError:
        return None
    row = await conn.fetchrow(EXACT)
    assert row is not None
    return int(row["tuple_count"]), int(row["dead_tuple_count"])


async def set_trigger(conn: Connection, *, enabled: bool) -> None:
    """Switch the outbox's trigger on or off (the benchmark's sandbox only)."""
    await conn.execute(ENABLE_TRIGGER if enabled else DISABLE_TRIGGER)
    found: bool = await conn.fetchval(TRIGGER_ENABLED)
    if found != enabled:
        raise RuntimeError(f"the trigger {TRIGGER} is still {'off' if enabled else 'on'}")


async def insert_events(conn: Connection, count: int) -> None:
    """``count`` pending events written straight into the outbox, in one statement."""
    await conn.execute(INSERT_EVENTS, count)


async def pending(conn: Connection) -> int:
    """Events in the outbox (pending or claimed)."""
    value: int = await conn.fetchval(PENDING)
    return value


async def sent(conn: Connection) -> int:
    """Events marked sent."""
    value: int = await conn.fetchval(SENT)
    return value


async def mark_of_nth(conn: Connection, nth: int) -> datetime | None:
    """When the relay marked its ``nth`` event sent (None: not yet)."""
    value: datetime | None = await conn.fetchval(MARK_OF_NTH, nth)
    return value


async def last_mark(conn: Connection) -> datetime:
    """When the relay last marked a batch sent."""
    value: datetime | None = await conn.fetchval(LAST_MARK)
    assert value is not None, "no event was sent"
    return value


@dataclass(frozen=True)
class RelayRate:
    """The relay's marks over a stretch: its batches, events and rate."""

    batches: int
    events: int  # every batch's, the first's included
    seconds: float  # from the first mark to the last
    first: int = 0  # the first batch's events

    @property
    def rate(self) -> float:
        """Events of every batch but the first, over the time from the first mark to the
        last (0 with fewer than two marks)."""
        if self.batches < 2 or self.seconds <= 0:
            return 0.0
        return (self.events - self.first) / self.seconds


async def relay_rate(conn: Connection, since: datetime, until: datetime) -> RelayRate:
    """The relay's rate from its marks between ``since`` and ``until`` (database clock)."""
    rows = await conn.fetch(MARKS, since, until)
    if not rows:
        return RelayRate(0, 0, 0.0)
    seconds = (rows[-1]["at"] - rows[0]["at"]).total_seconds()
    return RelayRate(len(rows), sum(row["n"] for row in rows), seconds, rows[0]["n"])


async def expiries_span(conn: Connection) -> tuple[datetime, datetime]:
    """The first and the last expiry of the run (database clock)."""
    row = await conn.fetchrow(EXPIRIES_SPAN)
    assert row is not None
    assert row["first"] is not None, "no expiry in the run"
    return row["first"], row["last"]


async def now(conn: Connection) -> datetime:
    """The database's clock."""
    value: datetime = await conn.fetchval("SELECT clock_timestamp()")
    return value


@dataclass(frozen=True)
class Spread:
    """Seconds from each expiry's commit to its event's mark: count and percentiles."""

    events: int
    p50: float
    p99: float
    max: float


async def commit_to_mark(conn: Connection) -> Spread:
    """From ``expired_at`` to ``expiry_events_sent.at``, over every event sent."""
    row = await conn.fetchrow(COMMIT_TO_MARK)
    assert row is not None
    return Spread(row["n"], row["p50"], row["p99"], row["max"])


@dataclass(frozen=True)
class TableFigures:
    """The outbox's size and its statistics now, and the record's size."""

    bytes: int  # heap, indexes, TOAST, maps
    heap_bytes: int
    live: int
    dead: int
    autovacuums: int
    vacuums: int  # by hand (VACUUM): bench.outbox_aging's, where autovacuum is off
    sent_bytes: int  # expiry_events_sent, every partition


async def table_figures(conn: Connection) -> TableFigures:
    """``expiry_events`` as ``pg_stat_user_tables`` and the sizes say (the statistics are
    those the server has flushed: up to a second old)."""
    row = await conn.fetchrow(TABLE_FIGURES)
    assert row is not None
    return TableFigures(*row.values())
