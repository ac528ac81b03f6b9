"""Retention's statements: the audit tables' partitions (listed, made, detached,
dropped with a record), the prunes of what is not audit, the runs, and what is
retained (for status, the console and the gauges)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from service.adapters.postgres.pool import Connection, db_now, transaction
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


# The prunes: the non-audit rows that can no longer matter, in bounded batches, each
# walking its table's key in order (so that a run reads each row once, however many it
# deletes): $1 the cutoff, $2 the batch, $3 the last key of the batch before; each says
# how many it deleted and the last key.
@dataclass(frozen=True)
class Prune:
    sql: str
    first: object  # below every key: where the walk starts


def _walk(table: str, key: str, matching: str, first: object, join: str = "") -> Prune:
    """Delete a batch of ``table``'s rows ``matching`` (on ``t``, joined with ``join``),
    next in ``key`` order after $3."""
    return Prune(
        f"""
        WITH gone AS (
            DELETE FROM {table} x USING (
                SELECT t.{key} FROM {table} t {join}
                 WHERE t.{key} > $3 AND {matching}
                 ORDER BY t.{key} LIMIT $2) d
             WHERE x.{key} = d.{key}
            RETURNING x.{key} AS k)
        SELECT count(*) AS n, (array_agg(k ORDER BY k DESC))[1] AS last FROM gone
        """,
        first,
    )


_NIL = UUID(int=0)
_FINAL_HOLD = "JOIN reservations r ON r.id = t.reservation_id"
# The newest of a working table stays, whatever its age, so that status can still say
# when the last one was.
_NOT_NEWEST = "t.{key} <> (SELECT {key} FROM {table} ORDER BY finished_at DESC LIMIT 1)"
PRUNES: dict[str, Prune] = {
    # A lease only keeps the scan off a held hold; once the hold is final and the
    # lease over (an hour's grace for a consumer reading when it was published), it
    # is dead weight. $1 here: an hour ago.
    "publish_leases": _walk(
        "publish_leases",
        "reservation_id",
        "r.status <> 'held' AND t.lease_until < $1",
        _NIL,
        _FINAL_HOLD,
    ),
    # A parked hold that is no longer held has nothing left to keep the scan off.
    "parked_holds": _walk(
        "parked_holds",
        "reservation_id",
        "r.status <> 'held' AND t.parked_at < $1",
        _NIL,
        _FINAL_HOLD,
    ),
    # Dead letters closed or replayed before the retention, whose hold is not parked
    # (what the audit says of them stays until its own week goes).
    "dead_letters": _walk(
        "dead_letters",
        "id",
        "t.status IN ('replayed', 'closed') AND t.updated_at < $1"
        " AND NOT EXISTS (SELECT 1 FROM parked_holds p WHERE p.dead_letter_id = t.id)",
        0,
    ),
    # A dead webhook delivery whose dead letter was closed before the retention, or has
    # gone (the prune above): it is never sent again, and the audit keeps what it was.
    "webhook_deliveries": _walk(
        "webhook_deliveries",
        "id",
        "t.dead AND NOT EXISTS (SELECT 1 FROM dead_letters l"
        " WHERE l.message_id = 'webhook:' || t.endpoint || ':' || t.message_id"
        " AND (l.status <> 'closed' OR l.updated_at >= $1))",
        0,
    ),
    "console_sessions": _walk(
        "console_sessions", "id", "coalesce(t.ended_at, t.last_seen_at) < $1", 0
    ),
    # Working records: $1 is the working cutoff.
    "scan_passes": _walk(
        "scan_passes",
        "scanner",
        "t.finished_at < $1 AND " + _NOT_NEWEST.format(key="scanner", table="scan_passes"),
        "",
    ),
    "retention_runs": _walk(
        "retention_runs",
        "runner",
        "t.finished_at < $1 AND " + _NOT_NEWEST.format(key="runner", table="retention_runs"),
        "",
    ),
    "delivery_crashes": _walk("delivery_crashes", "message_id", "t.last_at < $1", ""),
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
    "expiry_events",  # the outbox: pending events only (never dropped; the sent ones are audit)
    *AUDIT_TABLES,
    "dead_letters",
    "parked_holds",
    "delivery_crashes",
    "scan_passes",
    "console_sessions",
    "retention_actions",
    "retention_runs",
    "webhook_endpoints",
    "webhook_deliveries",  # pending and dead deliveries (the delivered ones go at once)
)
RETAINED = """
SELECT t.name,
       -- A partitioned table holds nothing itself: its partitions do (pg_partition_tree
       -- lists them, and nothing for a table that is not partitioned).
       (SELECT coalesce(sum(pg_total_relation_size(part)), 0)
          FROM (SELECT relid AS part FROM pg_partition_tree(to_regclass(t.name))
                UNION SELECT to_regclass(t.name)) AS tree)::bigint AS bytes,
       (SELECT min(expiry_partition_low(i.inhrelid)) FROM pg_inherits i
         WHERE i.inhparent = to_regclass(t.name)) AS since,
       (SELECT max(expiry_partition_high(i.inhrelid)) FROM pg_inherits i
         WHERE i.inhparent = to_regclass(t.name)) AS until
  FROM unnest($1::text[]) WITH ORDINALITY AS t(name, n)
 WHERE to_regclass(t.name) IS NOT NULL
 ORDER BY t.n
"""
LAST_OK_RUN = (
    "SELECT max(finished_at) AS last_ok, now() AS at FROM retention_runs WHERE result = 'ok'"
)
# When retention began: the migration that brought it (the scan's role may not read the
# ledger, and needs not: only status judges "has not run for a day" by it).
RETENTION_BEGAN = "SELECT applied_at FROM schema_migrations WHERE version = '0013_retention'"


# A run counts a week's partition before it drops it (seconds for a week of a million
# expiries a day) and waits for a concurrent detach: the statement timeout of the
# service's connections (EXPIRY_STATEMENT_TIMEOUT_MS) is for the hot path, not for this.
RUN_SESSION = "SET statement_timeout = '30min'"
RUN_TRANSACTION = "SET LOCAL statement_timeout = '30min'"
# The run lock waits as long (pg_advisory_lock did, under the run's statement timeout).
RUN_WAIT_SECONDS = 1800.0


# Whether this session may make and drop partitions: it owns the audit tables (or is a
# member of the role that does, a superuser included); and who owns them.
OWNER = """
SELECT pg_has_role(current_user, c.relowner, 'USAGE') AS owns,
       pg_get_userbyid(c.relowner) AS owner, current_user AS me
  FROM pg_class c WHERE c.oid = 'reservation_transitions'::regclass
"""


async def not_owner(conn: Connection) -> str | None:
    """Why this session may not run retention (None: it may)."""
    row = await conn.fetchrow(OWNER)
    if row is None or row["owns"]:
        return None
    return (
        f"retention runs as the owner of the tables ({row['owner']}), like migrate; "
        f"this is {row['me']}"
    )


async def relax_session(conn: Connection, *, pooled: bool) -> None:
    """The run's statements may take longer than the hot path's (``RUN_SESSION``); behind
    a transaction pooler a session's setting would outlive the run on another client's
    session: its statements have the server's default there, and its transactions
    ``RUN_TRANSACTION``."""
    if not pooled:
        await conn.execute(RUN_SESSION)


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
    async with transaction(conn):
        await conn.execute(RUN_TRANSACTION)
        rows: int = await conn.fetchval(f'SELECT count(*) FROM "{name}"')
        await record_action(conn, "dropped", table, low, high, rows, who)
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
    """``table``'s prune, batch by batch (at most ``batch`` rows a statement, each its own
    transaction): how many went."""
    prune = PRUNES[table]
    after, total = prune.first, 0
    while True:
        gone = await conn.fetchrow(prune.sql, cutoff, batch, after)  # an aggregate: a row
        count, last = (gone["n"], gone["last"]) if gone is not None else (0, None)
        total += count
        if count < batch:
            return total
        after = last  # the database's order, its collation included


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
    at: datetime  # the database's clock when read

    @property
    def partitions_ahead_seconds(self) -> dict[str, float]:
        """How far each audit table's partitions reach past ``at``."""
        return {t.name: (t.until - self.at).total_seconds() for t in self.tables if t.until}


async def retained(conn: Connection, tables: Sequence[str] = TABLES) -> Retained:
    rows = await conn.fetch(RETAINED, list(tables))
    last = await conn.fetchrow(LAST_OK_RUN)  # an aggregate: always a row
    last_ok, at = (last["last_ok"], last["at"]) if last is not None else (None, await db_now(conn))
    return Retained(
        [TableRetained(r["name"], r["bytes"], r["since"], r["until"]) for r in rows], last_ok, at
    )


async def retention_began(conn: Connection) -> datetime | None:
    began: datetime | None = await conn.fetchval(RETENTION_BEGAN)
    return began
