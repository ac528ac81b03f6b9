"""Reservations: the guarded transition (alone, batched) with its audit row, state, backlog."""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

import asyncpg

from service.adapters.postgres.pool import Connection, carries_timeouts, transaction
from service.adapters.telemetry.readings import BACKLOG_BUCKETS, Backlog
from service.core.domain import BatchRow, Expiry, outcome_of

# The guarded transition and its audit row, in one statement (so one
# transaction): only a held reservation whose deadline has passed by the
# database's clock moves to expired, and only the winner writes the audit row,
# with the trace of its delivery ($5, NULL: none), whose insert writes the event
# (the trigger of migration 0014_events: nothing more is sent from here).
# It waits for a row another transaction holds (up to the lock timeout).
_EXPIRE_ONE = """
WITH {locked}expired AS (
    UPDATE reservations
       SET status = 'expired', updated_at = now()
     WHERE id = $1 AND status = 'held' AND hold_until <= now(){only_locked}
 RETURNING id, extract(epoch FROM now() - hold_until)::float8 AS lag,
           (SELECT extract(epoch FROM now() - l.last_published)::float8
              FROM publish_leases l WHERE l.reservation_id = reservations.id) AS since_published
), audit AS (
    INSERT INTO reservation_transitions
           (reservation_id, from_status, to_status, message_id, attempt, worker, traceparent)
    SELECT id, 'held', 'expired', $2, $3, $4, $5 FROM expired
)
SELECT EXISTS (SELECT 1 FROM expired) AS won, (SELECT lag FROM expired) AS lag,
       (SELECT since_published FROM expired) AS since_published,
       r.status, r.hold_until <= now() AS due
  FROM (SELECT 1) AS one
  LEFT JOIN reservations r ON r.id = $1
"""
EXPIRE_RESERVATION = _EXPIRE_ONE.format(locked="", only_locked="")

# The same for a batch of one, which never waits: a row another transaction holds
# is left alone (it comes back held and due, not won: the batcher hands it to the
# one-at-a-time path, which tries it once more, then retries it later).
EXPIRE_RESERVATION_UNLESS_LOCKED = _EXPIRE_ONE.format(
    locked="""locked AS (
    SELECT id FROM reservations
     WHERE id = $1 AND status = 'held' AND hold_until <= now()
       FOR NO KEY UPDATE SKIP LOCKED
), """,
    only_locked=" AND id IN (SELECT id FROM locked)",
)


READ_RESERVATION = "SELECT status, hold_until <= now() AS due FROM reservations WHERE id = $1"


async def expire_reservation(
    conn: Connection,
    reservation_id: UUID,
    *,
    message_id: str,
    attempt: int,
    worker: str,
    lock_wait_ms: int | None = None,
    traceparent: str | None = None,
) -> Expiry:
    """Run the guarded transition; return what happened (raises for unknown ids).

    ``lock_wait_ms``: wait at most that long for a row another transaction holds
    (instead of the session's lock timeout), then raise ``LockNotAvailableError``.
    ``traceparent``: the delivery's trace, recorded with the audit row (and its event).
    """
    args = (reservation_id, message_id, attempt, worker, traceparent)
    if lock_wait_ms is None and carries_timeouts(conn):
        row = await conn.fetchrow(EXPIRE_RESERVATION, *args)
    else:  # behind a transaction pooler, only a transaction has the lock timeout
        async with transaction(conn):
            if lock_wait_ms is not None:
                await conn.execute(f"SET LOCAL lock_timeout = {int(lock_wait_ms)}")
            row = await conn.fetchrow(EXPIRE_RESERVATION, *args)
    assert row is not None  # the LEFT JOIN always yields one row
    won, status, due = bool(row["won"]), row["status"], bool(row["due"])
    if not won and status == "held" and due:
        # The statement read the row before a concurrent writer committed:
        # read it again, now that the update has waited for that writer.
        fresh = await reservation_state(conn, reservation_id)
        status, due = fresh if fresh else (None, False)
    return Expiry(outcome_of(won=won, status=status, due=due), row["lag"], row["since_published"])


# The batched guarded update: rows are locked in id order (so two consumers
# with overlapping batches never deadlock), the guard is the same as above, and
# every winner writes its audit row (with its delivery's trace), and so its event;
# one row per distinct id comes back. A row another transaction holds (the support
# side consuming it, say) is skipped, not waited for: it comes back held and due
# but not won, and only it goes on alone.
EXPIRE_BATCH = """
WITH batch AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::int[], $4::text[])
                  AS b (id, message_id, attempt, traceparent)
), locked AS (
    SELECT r.id FROM reservations r JOIN batch b ON b.id = r.id
     WHERE r.status = 'held' AND r.hold_until <= now()
     ORDER BY r.id
       FOR NO KEY UPDATE OF r SKIP LOCKED
), expired AS (
    UPDATE reservations r
       SET status = 'expired', updated_at = now()
      FROM locked l
     WHERE r.id = l.id AND r.status = 'held' AND r.hold_until <= now()
 RETURNING r.id, extract(epoch FROM now() - r.hold_until)::float8 AS lag,
           (SELECT extract(epoch FROM now() - pl.last_published)::float8
              FROM publish_leases pl WHERE pl.reservation_id = r.id) AS since_published
), audit AS (
    INSERT INTO reservation_transitions
           (reservation_id, from_status, to_status, message_id, attempt, worker, traceparent)
    SELECT e.id, 'held', 'expired', b.message_id, b.attempt, $5, b.traceparent
      FROM expired e JOIN batch b ON b.id = e.id
)
SELECT b.id, e.id IS NOT NULL AS won, e.lag, e.since_published, r.status,
       r.hold_until <= now() AS due
  FROM batch b
  LEFT JOIN expired e ON e.id = b.id
  LEFT JOIN reservations r ON r.id = b.id
"""


async def expire_batch(
    conn: Connection,
    ids: Sequence[UUID],
    message_ids: Sequence[str],
    attempts: Sequence[int],
    traceparents: Sequence[str | None] | None = None,
    *,
    worker: str,
) -> dict[UUID, BatchRow]:
    """Run the guarded transition for distinct ids in one statement (one transaction),
    never waiting for a row another transaction holds (that row is not won); each
    winner's audit row records its ``traceparents`` entry (None: none).

    A batch of one runs the single-row statement, the same transition and audit
    row for less of PostgreSQL's time (the batched statement's arrays, unnest and
    joins are paid for nothing; figures: docs/benchmark.md#a-batch-of-one): under a
    steady load, and with ``EXPIRY_BATCH_SIZE=1``, most batches hold one delivery.
    """
    traces = list(traceparents) if traceparents is not None else [None] * len(ids)
    if len(ids) == 1:
        one = await conn.fetchrow(
            EXPIRE_RESERVATION_UNLESS_LOCKED, ids[0], message_ids[0], attempts[0], worker, traces[0]
        )
        assert one is not None  # the LEFT JOIN always yields one row
        return {ids[0]: _batch_row(one)}
    rows = await conn.fetch(
        EXPIRE_BATCH, list(ids), list(message_ids), list(attempts), traces, worker
    )
    return {row["id"]: _batch_row(row) for row in rows}


def _batch_row(row: asyncpg.Record) -> BatchRow:
    return BatchRow(
        bool(row["won"]), row["lag"], row["status"], bool(row["due"]), row["since_published"]
    )


# Due held reservations by deadline age (width_bucket over the bounds in $1); a
# parked hold (its dead letter closed by an operator) waits on purpose: not counted.
BACKLOG = """
SELECT width_bucket(extract(epoch FROM now() - hold_until)::float8, $1::float8[]) AS bucket,
       count(*) AS n, max(extract(epoch FROM now() - hold_until))::float8 AS oldest
  FROM reservations r
 WHERE status = 'held' AND hold_until <= now()
   AND NOT EXISTS (SELECT 1 FROM parked_holds p WHERE p.reservation_id = r.id)
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


async def reservation_state(conn: Connection, reservation_id: UUID) -> tuple[str, bool] | None:
    """A reservation's status and whether it is due now, or ``None`` if unknown."""
    row = await conn.fetchrow(READ_RESERVATION, reservation_id)
    return (row["status"], bool(row["due"])) if row else None


TRANSITIONS_OF = """
SELECT from_status, to_status, at, message_id, attempt, worker
  FROM reservation_transitions WHERE reservation_id = $1 ORDER BY id
"""


async def transitions_of(conn: Connection, reservation_id: UUID) -> list[asyncpg.Record]:
    """The audit trail of one reservation."""
    return await conn.fetch(TRANSITIONS_OF, reservation_id)
