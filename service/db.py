"""PostgreSQL: the pool, every SQL statement the service runs, one function each."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeAlias
from uuid import UUID

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from service.domain import Outcome, outcome_of
from service.metrics import BACKLOG_BUCKETS, Backlog
from service.records import DeadLetterRecord
from service.redaction import redact
from service.settings import Settings

if TYPE_CHECKING:  # the stubs make these generic; the runtime classes are not
    Pool: TypeAlias = asyncpg.Pool[asyncpg.Record]
    Connection: TypeAlias = asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]
    PlainConnection: TypeAlias = asyncpg.Connection[asyncpg.Record]
else:
    Pool = asyncpg.Pool
    Connection = asyncpg.Connection | PoolConnectionProxy
    PlainConnection = asyncpg.Connection

EPOCH_START = datetime(1, 1, 1, tzinfo=UTC)
NIL_UUID = UUID(int=0)


def _connect_options(settings: Settings, application_name: str) -> dict[str, Any]:
    return {
        "timeout": settings.db_connect_timeout_seconds,
        "command_timeout": settings.statement_timeout_ms / 1000 + 5,
        "server_settings": {
            "application_name": application_name,
            "lock_timeout": str(settings.lock_timeout_ms),
            "statement_timeout": str(settings.statement_timeout_ms),
        },
    }


async def create_pool(settings: Settings, *, application_name: str, size: int) -> Pool:
    """Open a pool whose sessions carry the lock and statement timeouts."""
    try:
        return await asyncpg.create_pool(
            settings.database_url,
            min_size=1,
            max_size=size,
            reset=_keep_session,
            **_connect_options(settings, application_name),
        )
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise _unreachable(settings, exc) from exc


async def _keep_session(_conn: PlainConnection) -> None:
    """Pool release without asyncpg's default reset (one round trip per release).

    Safe because the service never leaves session state on a pooled connection:
    no LISTEN, no session SET (timeouts come with the connection), no advisory
    locks; an open transaction is still rolled back by asyncpg itself.
    """


async def connect(settings: Settings, *, application_name: str) -> PlainConnection:
    """Open one connection (for the scan and the migrations)."""
    try:
        return await asyncpg.connect(
            settings.database_url, **_connect_options(settings, application_name)
        )
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise _unreachable(settings, exc) from exc


def _unreachable(settings: Settings, exc: BaseException) -> ConnectionError:
    reason = str(exc).strip() or type(exc).__name__
    return ConnectionError(redact(f"cannot reach PostgreSQL at {settings.database_url}: {reason}"))


DB_NOW = "SELECT now()"
PING = "SELECT 1"

# The guarded transition and its audit row, in one statement (so one
# transaction): only a held reservation whose deadline has passed by the
# database's clock moves to expired, and only the winner writes the audit row.
EXPIRE_RESERVATION = """
WITH expired AS (
    UPDATE reservations
       SET status = 'expired', updated_at = now()
     WHERE id = $1 AND status = 'held' AND hold_until <= now()
 RETURNING id, extract(epoch FROM now() - hold_until)::float8 AS lag
), audit AS (
    INSERT INTO reservation_transitions
           (reservation_id, from_status, to_status, message_id, attempt, worker)
    SELECT id, 'held', 'expired', $2, $3, $4 FROM expired
)
SELECT EXISTS (SELECT 1 FROM expired) AS won, (SELECT lag FROM expired) AS lag,
       r.status, r.hold_until <= now() AS due
  FROM (SELECT 1) AS one
  LEFT JOIN reservations r ON r.id = $1
"""

READ_RESERVATION = "SELECT status, hold_until <= now() AS due FROM reservations WHERE id = $1"


# One keyset page of due, held reservations without a live lease, oldest
# deadline first, locked (until the claim commits) so that an overlapping scan
# skips them.
CLAIM_DUE = """
SELECT r.id, r.hold_until
  FROM reservations r
 WHERE r.status = 'held'
   AND r.hold_until <= $1
   AND (r.hold_until, r.id) > ($2, $3)
   AND NOT EXISTS (SELECT 1 FROM publish_leases l
                    WHERE l.reservation_id = r.id AND l.lease_until > now())
 ORDER BY r.hold_until, r.id
 LIMIT $4
   FOR NO KEY UPDATE OF r SKIP LOCKED
"""

# A short claim: the page's rows are locked only for this statement's
# transaction, so consumers never wait behind a scan that is publishing.
# Only a lapsed lease is taken over: the conflict check reads the latest
# committed row, so a scan whose page query saw an older snapshot cannot take
# a claim that another scan has just committed (it gets no row back for it).
CLAIM_LEASES = """
INSERT INTO publish_leases (reservation_id, message_id, lease_until)
SELECT id, message_id, clock_timestamp() + make_interval(secs => $3)
  FROM unnest($1::uuid[], $2::text[]) AS batch (id, message_id)
    ON CONFLICT (reservation_id) DO UPDATE
   SET message_id = EXCLUDED.message_id, lease_until = EXCLUDED.lease_until
 WHERE publish_leases.lease_until <= clock_timestamp()
RETURNING reservation_id
"""

# The broker confirmed these: the lease now runs for the full lease length.
RECORD_LEASES = """
UPDATE publish_leases
   SET lease_until = clock_timestamp() + make_interval(secs => $2),
       first_published = coalesce(first_published, clock_timestamp()),
       last_published = clock_timestamp(),
       publish_count = publish_count + 1
 WHERE reservation_id = ANY($1::uuid[])
"""

# Not confirmed: let the claim lapse now, so that the next scan publishes again.
RELEASE_CLAIMS = """
UPDATE publish_leases SET lease_until = clock_timestamp() WHERE reservation_id = ANY($1::uuid[])
"""


@dataclass(frozen=True)
class DueHold:
    """A held reservation whose deadline has passed."""

    id: UUID
    hold_until: datetime


async def ping(conn: Connection) -> None:
    """A round trip: the connection works."""
    await conn.fetchval(PING)


async def db_now(conn: Connection) -> datetime:
    """The database's clock: the only clock that decides what is due."""
    value: datetime = await conn.fetchval(DB_NOW)
    return value


@dataclass(frozen=True)
class Expiry:
    """What one guarded update did, and (if it expired the hold) the lag since its deadline."""

    outcome: Outcome
    lag_seconds: float | None


async def expire_reservation(
    conn: Connection, reservation_id: UUID, *, message_id: str, attempt: int, worker: str
) -> Expiry:
    """Run the guarded transition; return what happened (raises for unknown ids)."""
    row = await conn.fetchrow(EXPIRE_RESERVATION, reservation_id, message_id, attempt, worker)
    assert row is not None  # the LEFT JOIN always yields one row
    won, status, due = bool(row["won"]), row["status"], bool(row["due"])
    if not won and status == "held" and due:
        # The statement read the row before a concurrent writer committed:
        # read it again, now that the update has waited for that writer.
        fresh = await reservation_state(conn, reservation_id)
        status, due = fresh if fresh else (None, False)
    return Expiry(outcome_of(won=won, status=status, due=due), row["lag"])


# The batched guarded update: rows are locked in id order (so two consumers
# with overlapping batches never deadlock), the guard is the same as above, and
# every winner writes its audit row; one row per distinct id comes back.
EXPIRE_BATCH = """
WITH batch AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::int[]) AS b (id, message_id, attempt)
), locked AS (
    SELECT r.id FROM reservations r JOIN batch b ON b.id = r.id
     WHERE r.status = 'held' AND r.hold_until <= now()
     ORDER BY r.id
       FOR NO KEY UPDATE OF r
), expired AS (
    UPDATE reservations r
       SET status = 'expired', updated_at = now()
      FROM locked l
     WHERE r.id = l.id AND r.status = 'held' AND r.hold_until <= now()
 RETURNING r.id, extract(epoch FROM now() - r.hold_until)::float8 AS lag
), audit AS (
    INSERT INTO reservation_transitions
           (reservation_id, from_status, to_status, message_id, attempt, worker)
    SELECT e.id, 'held', 'expired', b.message_id, b.attempt, $4
      FROM expired e JOIN batch b ON b.id = e.id
)
SELECT b.id, e.id IS NOT NULL AS won, e.lag, r.status, r.hold_until <= now() AS due
  FROM batch b
  LEFT JOIN expired e ON e.id = b.id
  LEFT JOIN reservations r ON r.id = b.id
"""


MARK_HANDLING = """
INSERT INTO delivery_crashes (message_id) VALUES ($1)
    ON CONFLICT (message_id) DO UPDATE
   SET handled = delivery_crashes.handled + 1, last_at = now()
RETURNING handled
"""
CLEAR_HANDLING = "DELETE FROM delivery_crashes WHERE message_id = $1"


async def mark_handling(conn: Connection, message_id: str) -> int:
    """Count one more attempt at a redelivered command; return how many there were."""
    handled: int = await conn.fetchval(MARK_HANDLING, message_id)
    return handled


async def clear_handling(conn: Connection, message_id: str) -> None:
    """The command was handled without a crash: forget its count."""
    await conn.execute(CLEAR_HANDLING, message_id)


@dataclass(frozen=True)
class BatchRow:
    """What the batched update saw and did for one reservation."""

    won: bool
    lag: float | None
    status: str | None
    due: bool


async def expire_batch(
    conn: Connection,
    ids: Sequence[UUID],
    message_ids: Sequence[str],
    attempts: Sequence[int],
    *,
    worker: str,
) -> dict[UUID, BatchRow]:
    """Run the guarded transition for distinct ids in one statement (one transaction)."""
    rows = await conn.fetch(EXPIRE_BATCH, list(ids), list(message_ids), list(attempts), worker)
    return {
        row["id"]: BatchRow(bool(row["won"]), row["lag"], row["status"], bool(row["due"]))
        for row in rows
    }


async def claim_due(
    conn: Connection, *, until: datetime, after: tuple[datetime, UUID], limit: int
) -> list[DueHold]:
    """Lock the next page of due holds after the ``after`` cursor (in a transaction)."""
    rows = await conn.fetch(CLAIM_DUE, until, after[0], after[1], limit)
    return [DueHold(id=row["id"], hold_until=row["hold_until"]) for row in rows]


async def claim_leases(
    conn: Connection, ids: Sequence[UUID], message_ids: Sequence[str], *, claim_seconds: float
) -> set[UUID]:
    """Claim these holds for publishing (a claim that lapses on its own); return those
    this scan got (another scan may hold a live claim on some)."""
    rows = await conn.fetch(CLAIM_LEASES, list(ids), list(message_ids), claim_seconds)
    return {row["reservation_id"] for row in rows}


async def record_leases(conn: Connection, ids: Sequence[UUID], *, lease_seconds: int) -> None:
    """Record that these commands were confirmed by the broker."""
    await conn.execute(RECORD_LEASES, list(ids), float(lease_seconds))


async def release_claims(conn: Connection, ids: Sequence[UUID]) -> None:
    """These were not confirmed: the next scan may publish them again."""
    await conn.execute(RELEASE_CLAIMS, list(ids))


# Due held reservations by deadline age (width_bucket over the bounds in $1).
BACKLOG = """
SELECT width_bucket(extract(epoch FROM now() - hold_until)::float8, $1::float8[]) AS bucket,
       count(*) AS n, max(extract(epoch FROM now() - hold_until))::float8 AS oldest
  FROM reservations
 WHERE status = 'held' AND hold_until <= now()
 GROUP BY 1
"""


async def backlog(conn: Connection) -> Backlog:
    """The age of the oldest due held reservation and the due backlog by age."""
    bounds = [upper for _, upper in BACKLOG_BUCKETS[:-1]]
    result = Backlog()
    for row in await conn.fetch(BACKLOG, bounds):
        result.by_bucket[BACKLOG_BUCKETS[row["bucket"]][0]] = row["n"]
        result.oldest_due_age_seconds = max(result.oldest_due_age_seconds, row["oldest"])
    return result


# -- dead letters ----------------------------------------------------------

# Idempotent: recording the same dead letter twice changes nothing; a new
# dead-lettering of a replayed message (a later last_seen) counts up.
RECORD_DEAD_LETTER = """
INSERT INTO dead_letters (message_id, reservation_id, hold_until, error_class, give_up, reason,
                          attempts, first_seen, last_seen, worker, body_excerpt)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
    ON CONFLICT (message_id) DO UPDATE
   SET times_dead = dead_letters.times_dead
                    + (dead_letters.last_seen IS DISTINCT FROM EXCLUDED.last_seen)::int,
       status = CASE WHEN dead_letters.last_seen IS DISTINCT FROM EXCLUDED.last_seen
                     THEN 'dead' ELSE dead_letters.status END,
       error_class = EXCLUDED.error_class, give_up = EXCLUDED.give_up,
       reason = EXCLUDED.reason, attempts = EXCLUDED.attempts,
       first_seen = LEAST(dead_letters.first_seen, EXCLUDED.first_seen),
       last_seen = GREATEST(dead_letters.last_seen, EXCLUDED.last_seen),
       worker = EXCLUDED.worker, updated_at = now()
"""

DEAD_LETTER_COLUMNS = """
id, message_id, reservation_id, hold_until, error_class, give_up, reason, attempts,
first_seen, last_seen, worker, body_excerpt, status, times_dead, recorded_at, updated_at
"""

LIST_DEAD_LETTERS = f"""
SELECT {DEAD_LETTER_COLUMNS}
  FROM dead_letters
 WHERE ($1::text IS NULL OR status = $1)
   AND ($2::text IS NULL OR error_class = $2)
   AND ($3::float8 IS NULL OR last_seen <= now() - make_interval(secs => $3))
   AND ($4::float8 IS NULL OR last_seen >= now() - make_interval(secs => $4))
 ORDER BY last_seen DESC, id DESC
 LIMIT $5
"""

GET_DEAD_LETTER = f"""
SELECT {DEAD_LETTER_COLUMNS} FROM dead_letters WHERE id::text = $1 OR message_id = $1
"""

DEAD_LETTERS_BY_CLASS = """
SELECT error_class, count(*) AS n FROM dead_letters WHERE status = 'dead' GROUP BY 1 ORDER BY 2 DESC
"""

TRANSITIONS_OF = """
SELECT from_status, to_status, at, message_id, attempt, worker
  FROM reservation_transitions WHERE reservation_id = $1 ORDER BY id
"""

REPLAYS_OF = """
SELECT operator, at, outcome, detail, db_user, os_user, client_host
  FROM dead_letter_replays WHERE dead_letter_id = $1 ORDER BY id
"""

RECORD_REPLAY = """
INSERT INTO dead_letter_replays
       (dead_letter_id, message_id, operator, outcome, detail, os_user, client_host)
VALUES ($1, $2, $3, $4, $5, $6, $7)
"""

MARK_REPLAYED = "UPDATE dead_letters SET status = 'replayed', updated_at = now() WHERE id = $1"


async def record_dead_letter(conn: Connection, record: DeadLetterRecord) -> None:
    """Write (or refresh) the operator's record of one dead letter."""
    await conn.execute(
        RECORD_DEAD_LETTER,
        record.message_id,
        record.reservation_id,
        record.hold_until,
        record.error_class,
        record.give_up,
        record.reason,
        record.attempts,
        record.first_seen,
        record.last_seen,
        record.worker,
        record.body_excerpt,
    )


async def list_dead_letters(
    conn: Connection,
    *,
    status: str | None,
    error_class: str | None,
    older_than: float | None,
    newer_than: float | None,
    limit: int,
) -> list[asyncpg.Record]:
    """Dead letters, newest first, filtered (``None`` means no filter)."""
    return await conn.fetch(LIST_DEAD_LETTERS, status, error_class, older_than, newer_than, limit)


async def get_dead_letter(conn: Connection, key: str) -> asyncpg.Record | None:
    """One dead letter by its record id or its message id."""
    return await conn.fetchrow(GET_DEAD_LETTER, key)


async def dead_letters_by_class(conn: Connection) -> dict[str, int]:
    """Open dead letters counted by error class."""
    return {row["error_class"]: row["n"] for row in await conn.fetch(DEAD_LETTERS_BY_CLASS)}


async def transitions_of(conn: Connection, reservation_id: UUID) -> list[asyncpg.Record]:
    """The audit trail of one reservation."""
    return await conn.fetch(TRANSITIONS_OF, reservation_id)


async def replays_of(conn: Connection, dead_letter_id: int) -> list[asyncpg.Record]:
    """Every replay of one dead letter."""
    return await conn.fetch(REPLAYS_OF, dead_letter_id)


@dataclass(frozen=True)
class Actor:
    """Who acts, beyond the database user (which the database records itself)."""

    operator: str
    os_user: str
    host: str


async def record_replay(
    conn: Connection,
    dead_letter_id: int,
    message_id: str,
    *,
    actor: Actor,
    outcome: str,
    detail: str,
) -> None:
    """Audit one replay attempt (or refusal); mark the record replayed when republished."""
    async with conn.transaction():
        await conn.execute(
            RECORD_REPLAY,
            dead_letter_id,
            message_id,
            actor.operator,
            outcome,
            detail,
            actor.os_user,
            actor.host,
        )
        if outcome == "republished":
            await conn.execute(MARK_REPLAYED, dead_letter_id)


async def reservation_state(conn: Connection, reservation_id: UUID) -> tuple[str, bool] | None:
    """A reservation's status and whether it is due now, or ``None`` if unknown."""
    row = await conn.fetchrow(READ_RESERVATION, reservation_id)
    return (row["status"], bool(row["due"])) if row else None


# -- verification ------------------------------------------------------------------

VERIFY_TOTALS = """
SELECT count(*) FILTER (WHERE status = 'held') AS held,
       count(*) FILTER (WHERE status = 'expired') AS expired,
       count(*) FILTER (WHERE status = 'consumed') AS consumed,
       (SELECT count(*) FROM reservation_transitions) AS transitions
  FROM reservations
"""

# Each check lists its violations: (reservation id, a short fact).
VERIFY_CHECKS: dict[str, str] = {
    "expired-without-exactly-one-transition": """
        SELECT r.id, count(t.id)::text || ' expiring transitions' AS fact
          FROM reservations r
          LEFT JOIN reservation_transitions t
            ON t.reservation_id = r.id AND t.to_status = 'expired'
         WHERE r.status = 'expired'
         GROUP BY r.id HAVING count(t.id) <> 1
         LIMIT $1
    """,
    "left-a-final-state": """
        SELECT t.reservation_id, 'transition ' || t.from_status || ' -> ' || t.to_status AS fact
          FROM reservation_transitions t WHERE t.from_status IN ('expired', 'consumed')
        UNION ALL
        SELECT r.id, 'expired once, now ' || r.status
          FROM reservations r
         WHERE r.status <> 'expired'
           AND EXISTS (SELECT 1 FROM reservation_transitions t
                        WHERE t.reservation_id = r.id AND t.to_status = 'expired')
         LIMIT $1
    """,
    "expired-before-deadline": """
        SELECT r.id, 'expired ' || (r.hold_until - t.at)::text || ' early' AS fact
          FROM reservation_transitions t JOIN reservations r ON r.id = t.reservation_id
         WHERE t.to_status = 'expired' AND t.at < r.hold_until
         LIMIT $1
    """,
    "due-without-live-lease": """
        SELECT r.id, 'due for ' || date_trunc('second', now() - r.hold_until)::text
                     || ', lease ' || coalesce('lapsed ' || l.lease_until::text, 'never taken')
          FROM reservations r LEFT JOIN publish_leases l ON l.reservation_id = r.id
         WHERE r.status = 'held' AND r.hold_until <= now() - make_interval(secs => $2)
           AND (l.lease_until IS NULL OR l.lease_until <= now())
         LIMIT $1
    """,
}


# Whole-table checks: hash and merge joins (a nested loop over a table without
# statistics yet can take minutes), and more time than a single update gets.
VERIFY_SESSION = "SET LOCAL enable_nestloop = off; SET LOCAL statement_timeout = '10min'"


async def prepare_verification(conn: Connection) -> None:
    """Session settings for the verification queries (inside their transaction)."""
    await conn.execute(VERIFY_SESSION)


async def verify_totals(conn: Connection) -> dict[str, int]:
    """Reservations by status and the number of audited transitions."""
    row = await conn.fetchrow(VERIFY_TOTALS)
    return dict(row) if row else {}


async def verify_check(
    conn: Connection, name: str, *, limit: int, scan_interval: float
) -> list[tuple[UUID, str]]:
    """The violations of one named check (at most ``limit``)."""
    sql = VERIFY_CHECKS[name]
    args: tuple[object, ...] = (limit, scan_interval) if "$2" in sql else (limit,)
    return [(row[0], row[1]) for row in await conn.fetch(sql, *args)]
