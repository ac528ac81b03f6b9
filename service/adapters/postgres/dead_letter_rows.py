"""Dead-letter records and the audit of their replays."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg

from service.adapters.postgres.pool import Connection, transaction
from service.core.dead_letter import DeadLetterRecord
from service.core.default_owners import DEFAULT_OPERATOR, OwnerRule
from service.core.recorded_policy import Policy

# Idempotent: recording the same dead letter twice changes nothing; a new
# dead-lettering of a replayed message (a later last_seen) counts up.
RECORD_DEAD_LETTER = """
INSERT INTO dead_letters (message_id, reservation_id, hold_until, error_class, give_up, reason,
                          attempts, first_seen, last_seen, worker, body_excerpt, policy)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12::jsonb)
    ON CONFLICT (message_id) DO UPDATE
   SET times_dead = dead_letters.times_dead
                    + (dead_letters.last_seen IS DISTINCT FROM EXCLUDED.last_seen)::int,
       status = CASE WHEN dead_letters.last_seen IS DISTINCT FROM EXCLUDED.last_seen
                     THEN 'dead' ELSE dead_letters.status END,
       error_class = EXCLUDED.error_class, give_up = EXCLUDED.give_up,
       reason = EXCLUDED.reason, attempts = EXCLUDED.attempts,
       first_seen = LEAST(dead_letters.first_seen, EXCLUDED.first_seen),
       last_seen = GREATEST(dead_letters.last_seen, EXCLUDED.last_seen),
       worker = EXCLUDED.worker, policy = $12::jsonb, updated_at = now()
"""


# The default owner, only where there is none (an operator's is never overwritten),
# and its audit event (the database fills in id, at and db_user): one statement.
ASSIGN_DEFAULT_OWNER = """
WITH assigned AS (
    UPDATE dead_letters SET owner = $2, updated_at = now()
     WHERE message_id = $1 AND owner IS NULL
 RETURNING id
), audited AS (
    INSERT INTO dead_letter_events (dead_letter_id, kind, operator, detail)
    SELECT id, 'assigned', $3, $4 FROM assigned
)
SELECT count(*) FROM assigned
"""


# Open dead letters (status dead, as expiry_dead_letters_open counts them) that nobody
# owns, and how long ago the oldest of them was last dead-lettered (database clock).
UNOWNED_AND_OLDEST_OPEN = """
SELECT count(*) FILTER (WHERE owner IS NULL) AS unowned,
       COALESCE(GREATEST(0, EXTRACT(EPOCH FROM now() - min(last_seen))), 0)::float8 AS oldest
  FROM dead_letters
 WHERE status = 'dead'
"""


DEAD_LETTER_COLUMNS = """
id, message_id, reservation_id, hold_until, error_class, give_up, reason, attempts,
first_seen, last_seen, worker, body_excerpt, status, times_dead, owner, note, recorded_at,
updated_at, policy
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


# A page of the console's listing: newest first, after a (last_seen, id) cursor,
# by status, error class, give-up reason and last-seen age (NULL: any).
LIST_PAGE = f"""
SELECT {DEAD_LETTER_COLUMNS}
  FROM dead_letters
 WHERE status = ANY($1::text[])
   AND ($2::text IS NULL OR error_class = $2)
   AND ($3::text IS NULL OR give_up = $3)
   AND ($4::float8 IS NULL OR last_seen <= now() - make_interval(secs => $4))
   AND ($5::float8 IS NULL OR last_seen >= now() - make_interval(secs => $5))
   AND ($6::timestamptz IS NULL OR (last_seen, id) < ($6, $7))
 ORDER BY last_seen DESC, id DESC
 LIMIT $8
"""


# Dead letters by error class and give-up reason (and status), with their span.
GROUPS = """
SELECT error_class, give_up, status, count(*) AS n, min(first_seen) AS first_seen,
       max(last_seen) AS last_seen, count(owner) AS owned
  FROM dead_letters
 WHERE status = ANY($1::text[])
 GROUP BY 1, 2, 3
 ORDER BY max(last_seen) DESC
"""


GET_DEAD_LETTER = f"""
SELECT {DEAD_LETTER_COLUMNS} FROM dead_letters WHERE id::text = $1 OR message_id = $1
"""


DEAD_LETTERS_BY_CLASS = """
SELECT error_class, count(*) AS n FROM dead_letters WHERE status = 'dead' GROUP BY 1 ORDER BY 2 DESC
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


# A replay's outcomes that replayed it: a command republished, or a webhook delivery due
# again (its deliverer sends it again with the same webhook-id).
REPUBLISHED, REDELIVERING = "republished", "redelivering"
REPLAYED_OUTCOMES = (REPUBLISHED, REDELIVERING)

MARK_REPLAYED = "UPDATE dead_letters SET status = 'replayed', updated_at = now() WHERE id = $1"
# A replayed dead letter's hold is no longer parked: the scan may publish it again.
UNPARK_REPLAYED = "DELETE FROM parked_holds WHERE dead_letter_id = $1"


async def record_dead_letter(
    conn: Connection,
    record: DeadLetterRecord,
    *,
    policy: Policy | None = None,
    owner: OwnerRule | None = None,
) -> bool:
    """Write (or refresh) the operator's record of one dead letter, with the policy it was
    recorded under; and, in the same transaction, give it ``owner`` (audited) if it has
    none yet. True if this call assigned the owner."""
    if owner is None:
        await _upsert_dead_letter(conn, record, policy)
        return False
    async with transaction(conn):
        await _upsert_dead_letter(conn, record, policy)
        assigned: int = await conn.fetchval(
            ASSIGN_DEFAULT_OWNER, record.message_id, owner.owner, DEFAULT_OPERATOR, owner.detail()
        )
    return assigned > 0


async def _upsert_dead_letter(
    conn: Connection, record: DeadLetterRecord, policy: Policy | None
) -> None:
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
        policy.as_json() if policy is not None else None,
    )


async def unowned_and_oldest_open(conn: Connection) -> tuple[int, float]:
    """Open dead letters nobody owns, and the age in seconds of the oldest open one since
    it was last dead-lettered (0 when none is open)."""
    row = await conn.fetchrow(UNOWNED_AND_OLDEST_OPEN)
    assert row is not None  # an aggregate always returns its row
    return int(row["unowned"]), float(row["oldest"])


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


@dataclass(frozen=True)
class Page:
    """What a page of the listing shows (``None``: no filter)."""

    statuses: tuple[str, ...] = ("dead",)
    error_class: str | None = None
    give_up: str | None = None
    older_than: float | None = None
    newer_than: float | None = None
    after: tuple[datetime, int] | None = None  # the last row of the page before
    size: int = 50


async def list_page(conn: Connection, page: Page) -> list[asyncpg.Record]:
    """One page of dead letters, newest first (keyset: fast whatever the page's depth)."""
    after_seen, after_id = page.after if page.after else (None, None)
    return await conn.fetch(
        LIST_PAGE,
        list(page.statuses),
        page.error_class,
        page.give_up,
        page.older_than,
        page.newer_than,
        after_seen,
        after_id,
        page.size,
    )


async def dead_letter_groups(
    conn: Connection, statuses: tuple[str, ...] = ("dead",)
) -> list[asyncpg.Record]:
    """Dead letters counted by error class, give-up reason and status."""
    return await conn.fetch(GROUPS, list(statuses))


async def get_dead_letter(conn: Connection, key: str) -> asyncpg.Record | None:
    """One dead letter by its record id or its message id."""
    return await conn.fetchrow(GET_DEAD_LETTER, key)


async def dead_letters_by_class(conn: Connection) -> dict[str, int]:
    """Open dead letters counted by error class."""
    return {row["error_class"]: row["n"] for row in await conn.fetch(DEAD_LETTERS_BY_CLASS)}


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
    """Audit one replay attempt (or refusal); mark the record replayed when it was
    (``REPLAYED_OUTCOMES``)."""
    async with transaction(conn):
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
        if outcome in REPLAYED_OUTCOMES:
            await conn.execute(MARK_REPLAYED, dead_letter_id)
            await conn.execute(UNPARK_REPLAYED, dead_letter_id)
