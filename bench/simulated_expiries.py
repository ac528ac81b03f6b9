"""Expiries written in bulk as the scan and a consumer leave them, for ``bench.retention``.

An expiry is the hold's row in ``reservations`` (the application's table, now
'expired'), its ``publish_leases`` row (the lease long over) and its
``reservation_transitions`` row ('held' to 'expired', a worker ``host:1234``, message id
``expire:<uuid>:<ms>``, attempt 1), all three in one statement per batch
(``INSERT ... SELECT generate_series``); and the scanner's row of ``scan_passes``. The
audit tables' weekly partitions they fall in are made with ``expiry_make_partition``, as
the owner.
"""

from __future__ import annotations

from datetime import datetime

from bench.db import Connection
from service.core.weeks import AUDIT_TABLES, WEEK, week_of

WORKER = "host:1234"  # a consumer's worker id: host name and process id
SCANNER = "host:1233"

# `count` expiries from `start`, one every `spacing` seconds: the hold (due half a second
# before its expiry), its lease (published 0.3 s before, for the lease length) and its
# transition, in one statement (the foreign keys are checked at its end).
INSERT_EXPIRIES = """
WITH expiry AS MATERIALIZED (
    SELECT gen_random_uuid() AS id,
           $1::timestamptz + make_interval(secs => (g + 0.5) * $2::float8) AS at
      FROM generate_series(0, $3::int - 1) AS g
), command AS MATERIALIZED (
    SELECT id, at, at - interval '500 milliseconds' AS hold_until,
           at - interval '300 milliseconds' AS published,
           'expire:' || id::text || ':'
               || round(extract(epoch FROM at - interval '500 milliseconds') * 1000)::text
               AS message_id
      FROM expiry
), holds AS (
    INSERT INTO reservations (id, status, hold_until, created_at, updated_at)
    SELECT id, 'expired', hold_until, hold_until - interval '15 minutes', at FROM command
), leases AS (
    INSERT INTO publish_leases (reservation_id, message_id, lease_until, first_published,
                                last_published, publish_count)
    SELECT id, message_id, published + make_interval(secs => $5::int), published, published, 1
      FROM command
)
INSERT INTO reservation_transitions (reservation_id, from_status, to_status, at, message_id,
                                     attempt, worker)
SELECT id, 'held', 'expired', at, message_id, 1, $4 FROM command
"""

# The scanner's one row, as each of its passes leaves it.
SCAN_PASS = """
INSERT INTO scan_passes (scanner, started_at, finished_at, result, published, unconfirmed)
VALUES ($1, $2::timestamptz - interval '1 second', $2, 'ok', $3, 0)
    ON CONFLICT (scanner) DO UPDATE
   SET started_at = EXCLUDED.started_at, finished_at = EXCLUDED.finished_at,
       result = EXCLUDED.result, published = EXCLUDED.published, unconfirmed = 0
"""

MAKE_PARTITION = "SELECT expiry_make_partition($1, $2, $3)"


async def insert_expiries(
    conn: Connection, start: datetime, spacing: float, count: int, lease_seconds: int
) -> None:
    """``count`` expiries from ``start``, one every ``spacing`` seconds."""
    await conn.execute(INSERT_EXPIRIES, start, spacing, count, WORKER, lease_seconds)


async def record_scan_pass(conn: Connection, finished: datetime, published: int) -> None:
    """The scanner's row: its last pass finished at ``finished``, ``published`` commands."""
    await conn.execute(SCAN_PASS, SCANNER, finished, published)


async def make_weeks(conn: Connection, first: datetime, end: datetime) -> None:
    """The weekly partitions of every audit table from the week of ``first`` to ``end``."""
    week = week_of(first)
    while week < end:
        for table in AUDIT_TABLES:
            await conn.fetchval(MAKE_PARTITION, table, week, week + WEEK)
        week += WEEK
