"""``python -m bench.partition_move``: how long ``migrate`` takes to move an existing
database's audit trail under weekly partitions (migration 0013), with how many rows.

In a database of its own (removed afterwards): the migrations before 0013, then
``--transitions`` audit rows (a reservation each, spread over ``--days`` days), then
``service.migrate`` timed. The migration holds an ACCESS EXCLUSIVE lock on each audit
table from its first statement on it to its commit: the time printed bounds how long
writers to those tables wait.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid

import asyncpg

from service.adapters.postgres.databases import create_database, drop_database
from service.adapters.postgres.schema import migrate
from service.settings import Settings

BEFORE = "0012_console_sessions"
FILL = """
WITH r AS (
    INSERT INTO reservations (id, status, hold_until, created_at, updated_at)
    SELECT gen_random_uuid(), 'expired', t, t, t
      FROM (SELECT now() - (g::float8 / $1) * make_interval(days => $2) AS t
              FROM generate_series(1, $1) AS g) AS s
    RETURNING id, hold_until)
INSERT INTO reservation_transitions (reservation_id, from_status, to_status, at, message_id,
                                     attempt, worker)
SELECT id, 'held', 'expired', hold_until + interval '20 milliseconds',
       'expire:' || id || ':' || (extract(epoch FROM hold_until) * 1000)::bigint, 1,
       'host-1:4242'
  FROM r
"""


async def measure(admin_url: str, transitions: int, days: int) -> None:
    name = f"bench_move_{uuid.uuid4().hex[:8]}"
    url = await create_database(admin_url, name)
    try:
        await migrate(Settings(database_url=url), until=BEFORE)
        conn = await asyncpg.connect(url)
        try:
            began = time.perf_counter()
            await conn.execute(FILL, transitions, days)
            await conn.execute("VACUUM ANALYZE reservation_transitions")
            filled = time.perf_counter() - began
            size = await conn.fetchval(
                "SELECT pg_size_pretty(pg_total_relation_size('reservation_transitions'))"
            )
        finally:
            await conn.close()
        print(f"filled: {transitions:,} transitions over {days} days ({size}) in {filled:.1f}s")
        began = time.perf_counter()
        applied = await migrate(Settings(database_url=url))
        took = time.perf_counter() - began
        conn = await asyncpg.connect(url)
        try:
            kept = await conn.fetchval("SELECT count(*) FROM reservation_transitions")
            parts = await conn.fetchval(
                "SELECT count(*) FROM pg_inherits"
                " WHERE inhparent = 'reservation_transitions'::regclass"
            )
        finally:
            await conn.close()
        print(
            f"migrate {', '.join(applied)}: {took:.2f}s (the audit tables locked for at most "
            f"this long); {kept:,} transitions kept, in {parts} partitions"
        )
        assert kept == transitions, "rows lost"
    finally:
        await drop_database(admin_url, name)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.partition_move", description=__doc__)
    parser.add_argument("--transitions", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=60)
    args = parser.parse_args()
    admin = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    asyncio.run(measure(admin, args.transitions, args.days))


if __name__ == "__main__":
    main()
