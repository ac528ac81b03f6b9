"""Retention's statements: the audit tables' partitions (listed, made, detached,
dropped with a record), the prunes of what is not audit, the runs, and what is
retained (for status, the console and the gauges)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from service.adapters.postgres.pool import Connection
from service.core.weeks import AUDIT_TABLES, Partition

# A whole run at a time (a second waits for the first, then finds little to do).
RETENTION_LOCK_KEY = 0x72657465  # 'rete'

# Every partition of the audit tables, with its bounds and whether a concurrent
# detach of it was interrupted (it must be finalized).
PARTITIONS = """
SELECT p.relname AS parent, c.relname AS name,
       expiry_partition_low(c.oid) AS low, expiry_partition_high(c.oid) AS high,
       i.inhdetachpending AS pending
  FROM pg_inherits i
  JOIN pg_class c ON c.oid = i.inhrelid
  JOIN pg_class p ON p.oid = i.inhparent
 WHERE p.relname = ANY($1::text[]) AND p.relnamespace = c.relnamespace
   AND p.relnamespace = to_regnamespace(current_schema())
 ORDER BY p.relname, low
"""

# Tables named like a partition that are none: a run detached them and stopped before
# it dropped them.
DETACHED = r"""
SELECT c.relname AS name
  FROM pg_class c
 WHERE c.relnamespace = to_regnamespace(current_schema()) AND c.relkind = 'r'
   AND NOT c.relispartition
   AND c.relname ~ ('^(' || array_to_string($1::text[], '|') || ')_(w[0-9]{8}|legacy)$')
"""

MAKE_PARTITION = "SELECT expiry_make_partition($1, $2, $3)"
RECORD_ACTION = """
INSERT INTO retention_actions (action, table_name, range_from, range_to, rows, os_user,
                               client_host)
VALUES ($1, $2, $3, $4, $5, $6, $7)
"""

# The prunes: the non-audit rows that can no longer matter, in bounded batches.
# $1: the cutoff; each deletes at most $2 rows and returns how many it did.
PRUNES: dict[str, str] = {
    # A lease only keeps the scan off a held hold; once the hold is final and the
    # lease over (an hour's grace for a consumer reading when it was published), it
    # is dead weight. $1 here: an hour ago.
    "publish_leases": """
        WITH doomed AS (
            SELECT l.reservation_id FROM publish_leases l JOIN reservations r
                ON r.id = l.reservation_id
             WHERE r.status <> 'held' AND l.lease_until < $1
             LIMIT $2)
        DELETE FROM publish_leases l USING doomed d WHERE l.reservation_id = d.reservation_id
    """,
    # A parked hold that is no longer held has nothing left to keep the scan off.
    "parked_holds": """
        WITH doomed AS (
            SELECT p.reservation_id FROM parked_holds p JOIN reservations r
                ON r.id = p.reservation_id
             WHERE r.status <> 'held' AND p.parked_at < $1
             LIMIT $2)
        DELETE FROM parked_holds p USING doomed d WHERE p.reservation_id = d.reservation_id
    """,
    # Dead letters closed or replayed before the retention, whose hold is not parked
    # (what the audit says of them stays until its own week goes).
    "dead_letters": """
        WITH doomed AS (
            SELECT d.id FROM dead_letters d
             WHERE d.status IN ('replayed', 'closed') AND d.updated_at < $1
               AND NOT EXISTS (SELECT 1 FROM parked_holds p WHERE p.dead_letter_id = d.id)
             LIMIT $2)
        DELETE FROM dead_letters d USING doomed x WHERE d.id = x.id
    """,
    "console_sessions": """
        WITH doomed AS (
            SELECT id FROM console_sessions
             WHERE coalesce(ended_at, last_seen_at) < $1
             LIMIT $2)
        DELETE FROM console_sessions s USING doomed x WHERE s.id = x.id
    """,
    # Working records: $1 is the working cutoff. The newest pass and run stay, whatever
    # their age, so that status can still say when the last one was.
    "scan_passes": """
        WITH doomed AS (
            SELECT scanner FROM scan_passes
             WHERE finished_at < $1
               AND scanner <> (SELECT scanner FROM scan_passes ORDER BY finished_at DESC LIMIT 1)
             LIMIT $2)
        DELETE FROM scan_passes s USING doomed d WHERE s.scanner = d.scanner
    """,
    "retention_runs": """
        WITH doomed AS (
            SELECT runner FROM retention_runs
             WHERE finished_at < $1
               AND runner <> (SELECT runner FROM retention_runs ORDER BY finished_at DESC LIMIT 1)
             LIMIT $2)
        DELETE FROM retention_runs r USING doomed d WHERE r.runner = d.runner
    """,
    "delivery_crashes": """
        WITH doomed AS (SELECT message_id FROM delivery_crashes WHERE last_at < $1 LIMIT $2)
        DELETE FROM delivery_crashes c USING doomed d WHERE c.message_id = d.message_id
    """,
}
# Which cutoff each prune takes: an hour ago, the working records' or the retention's.
HOUR_CUTOFF = frozenset({"publish_leases", "parked_holds"})
WORKING = frozenset({"scan_passes", "retention_runs", "delivery_crashes"})

RECORD_RUN = """
INSERT INTO retention_runs (runner, finished_at, result) VALUES ($1, now(), $2)
    ON CONFLICT (runner) DO UPDATE SET finished_at = now(), result = EXCLUDED.result
"""

# What is retained: each table of the service with its size on disk (all partitions,
# indexes and TOAST), and for the audit tables the range their partitions cover.
TABLES = (
    "reservations",
    "publish_leases",
    *AUDIT_TABLES,
    "dead_letters",
    "parked_holds",
    "delivery_crashes",
    "scan_passes",
    "console_sessions",
    "retention_actions",
    "retention_runs",
)
RETAINED = """
SELECT t.name,
       (SELECT coalesce(sum(pg_total_relation_size(relid)), 0)
          FROM pg_partition_tree(to_regclass(t.name)))::bigint AS bytes,
       (SELECT min(expiry_partition_low(i.inhrelid)) FROM pg_inherits i
         WHERE i.inhparent = to_regclass(t.name)) AS since,
       (SELECT max(expiry_partition_high(i.inhrelid)) FROM pg_inherits i
         WHERE i.inhparent = to_regclass(t.name)) AS until
  FROM unnest($1::text[]) WITH ORDINALITY AS t(name, n)
 WHERE to_regclass(t.name) IS NOT NULL
 ORDER BY t.n
"""
LAST_OK_RUN = "SELECT max(finished_at) FROM retention_runs WHERE result = 'ok'"
# When retention began: the migration that brought it (the scan's role may not read the
# ledger, and needs not: only status judges "has not run for a day" by it).
RETENTION_BEGAN = "SELECT applied_at FROM schema_migrations WHERE version = '0013_retention'"


async def lock_run(conn: Connection) -> None:
    """Wait for any other run to end, then hold the run lock (until ``unlock_run``)."""
    await conn.execute("SELECT pg_advisory_lock($1)", RETENTION_LOCK_KEY)


async def unlock_run(conn: Connection) -> None:
    await conn.execute("SELECT pg_advisory_unlock($1)", RETENTION_LOCK_KEY)


@dataclass(frozen=True)
class Listed:
    """The audit tables' partitions, and the ones left half-detached or detached."""

    partitions: list[Partition]
    pending: list[Partition]
    detached: list[str]


async def list_partitions(conn: Connection) -> Listed:
    rows = await conn.fetch(PARTITIONS, list(AUDIT_TABLES))
    found = [Partition(r["parent"], r["name"], r["low"], r["high"]) for r in rows]
    pending = {r["name"] for r in rows if r["pending"]}
    detached = [r["name"] for r in await conn.fetch(DETACHED, list(AUDIT_TABLES))]
    return Listed(
        [p for p in found if p.name not in pending],
        [p for p in found if p.name in pending],
        detached,
    )


async def make_partition(conn: Connection, table: str, low: datetime, high: datetime) -> str | None:
    """Make the partition (None: one of its name exists already)."""
    made: str | None = await conn.fetchval(MAKE_PARTITION, table, low, high)
    return made


async def detach(conn: Connection, partition: Partition, *, finalize: bool = False) -> None:
    """Detach without blocking writers (outside a transaction); ``finalize`` completes an
    interrupted one."""
    how = "FINALIZE" if finalize else "CONCURRENTLY"
    await conn.execute(f'ALTER TABLE "{partition.table}" DETACH PARTITION "{partition.name}" {how}')


@dataclass(frozen=True)
class Who:
    """Who runs retention, beside the database user the database records itself."""

    os_user: str | None
    host: str | None


async def drop_detached(
    conn: Connection,
    table: str,
    name: str,
    low: datetime | None,
    high: datetime | None,
    who: Who,
) -> int:
    """Count a detached partition's rows, record the drop and drop it, in one transaction;
    return the count."""
    async with conn.transaction():
        rows: int = await conn.fetchval(f'SELECT count(*) FROM "{name}"')
        await conn.execute(RECORD_ACTION, "dropped", table, low, high, rows, who.os_user, who.host)
        await conn.execute(f'DROP TABLE "{name}"')
    return rows


async def record_action(
    conn: Connection,
    action: str,
    table: str,
    low: datetime | None,
    high: datetime | None,
    rows: int,
    who: Who,
) -> None:
    await conn.execute(RECORD_ACTION, action, table, low, high, rows, who.os_user, who.host)


async def prune(conn: Connection, table: str, cutoff: datetime, *, batch: int) -> int:
    """One batch of ``table``'s prune (at most ``batch`` rows): how many went."""
    status = await conn.execute(PRUNES[table], cutoff, batch)
    return int(status.rsplit(" ", 1)[-1])


async def record_run(conn: Connection, runner: str, result: str) -> None:
    await conn.execute(RECORD_RUN, runner, result)


@dataclass(frozen=True)
class TableRetained:
    """One table: its size, and (audit tables) the range its partitions cover."""

    name: str
    bytes: int
    since: datetime | None
    until: datetime | None


@dataclass(frozen=True)
class Retained:
    tables: list[TableRetained]
    last_ok: datetime | None  # the last run that succeeded (None: none)

    def table(self, name: str) -> TableRetained | None:
        return next((t for t in self.tables if t.name == name), None)


async def retained(conn: Connection, tables: Sequence[str] = TABLES) -> Retained:
    rows = await conn.fetch(RETAINED, list(tables))
    last_ok: datetime | None = await conn.fetchval(LAST_OK_RUN)
    return Retained(
        [TableRetained(r["name"], r["bytes"], r["since"], r["until"]) for r in rows], last_ok
    )


async def retention_began(conn: Connection) -> datetime | None:
    began: datetime | None = await conn.fetchval(RETENTION_BEGAN)
    return began
