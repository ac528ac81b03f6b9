"""The outbox (``expiry_events``, migration 0014_events): what the relay claims, marks
sent and gives back, how the consumers wake it, and what is pending.

A claim is a lease: a relay takes up to a batch of the oldest events no lease holds
(``FOR UPDATE SKIP LOCKED``: two relays never take the same one), stamps them with a
token of its own until ``lease_until``, and publishes them. Only while its lease holds
does marking them sent (moving them to ``expiry_events_sent``) match them: a relay
whose lease lapsed marks nothing, and the events it published are published again,
with the same message ids, by whoever claims them next.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from service.adapters.postgres.pool import Connection, transaction

# The relays LISTEN here; the consumers NOTIFY after a commit that wrote events (never
# inside it: a NOTIFY takes a cluster-wide lock at commit), at most once in a while.
CHANNEL = "expiry_events"
NOTIFY = f"NOTIFY {CHANNEL}"

CLAIM_EVENTS = """
WITH next AS (
    SELECT id FROM expiry_events
     WHERE lease_until IS NULL OR lease_until < now()
     ORDER BY id
     LIMIT $1
       FOR UPDATE SKIP LOCKED
)
UPDATE expiry_events e
   SET lease_until = now() + make_interval(secs => $2), lease_token = $3,
       claims = e.claims + 1
  FROM next
 WHERE e.id = next.id
RETURNING e.id, e.reservation_id, e.hold_until, e.expired_at, e.message_id,
          e.traceparent, e.claims
"""

# Sent: out of the outbox and into the record, only while the claim's lease holds. The
# ids come back from the outbox's side: the relay may write the record, not read it (an
# INSERT's RETURNING needs SELECT on what it returns; a data-modifying WITH runs whole).
MARK_SENT = """
WITH sent AS (
    DELETE FROM expiry_events
     WHERE id = ANY($1::bigint[]) AND lease_token = $2 AND lease_until >= now()
 RETURNING id, reservation_id, message_id, expired_at, created_at, claims
), recorded AS (
    INSERT INTO expiry_events_sent (id, reservation_id, message_id, expired_at, created_at,
                                    claims, relay)
    SELECT id, reservation_id, message_id, expired_at, created_at, claims, $3 FROM sent
)
SELECT id FROM sent
"""

# Not sent (the broker refused or could not be reached): free for the next claim now,
# not when the lease runs out.
RELEASE_CLAIM = """
UPDATE expiry_events SET lease_until = NULL, lease_token = NULL
 WHERE id = ANY($1::bigint[]) AND lease_token = $2
"""

PENDING = """
SELECT count(*) AS pending,
       coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 AS oldest_age
  FROM expiry_events
"""


@dataclass(frozen=True)
class PendingEvent:
    """An event claimed for publishing."""

    id: int
    reservation_id: UUID
    hold_until: datetime
    expired_at: datetime
    message_id: str
    traceparent: str | None
    claims: int  # more than 1: it was claimed before, and maybe published


@dataclass(frozen=True)
class Pending:
    """The outbox's backlog."""

    count: int
    oldest_age_seconds: float  # 0 when empty


async def claim_events(
    conn: Connection, limit: int, *, lease_seconds: float, token: UUID
) -> list[PendingEvent]:
    """Claim up to ``limit`` of the oldest unleased events for ``lease_seconds``."""
    rows = await conn.fetch(CLAIM_EVENTS, limit, lease_seconds, token)
    events = [
        PendingEvent(
            r["id"],
            r["reservation_id"],
            r["hold_until"],
            r["expired_at"],
            r["message_id"],
            r["traceparent"],
            r["claims"],
        )
        for r in rows
    ]
    return sorted(events, key=lambda event: event.id)


async def mark_sent(conn: Connection, ids: Sequence[int], *, token: UUID, relay: str) -> int:
    """Move what was published out of the outbox, if the claim ``token`` still holds it;
    how many were (fewer than ``ids``: the lease lapsed for the others)."""
    async with transaction(conn):
        rows = await conn.fetch(MARK_SENT, list(ids), token, relay)
    return len(rows)


async def release_claim(conn: Connection, ids: Sequence[int], *, token: UUID) -> None:
    """Give back what could not be published, for the next claim."""
    await conn.execute(RELEASE_CLAIM, list(ids), token)


async def notify(conn: Connection) -> None:
    """Wake the relays (after a commit that wrote events)."""
    await conn.execute(NOTIFY)


async def pending(conn: Connection) -> Pending:
    """How many events wait, and how long the oldest has."""
    row = await conn.fetchrow(PENDING)
    assert row is not None  # an aggregate always yields a row
    return Pending(row["pending"], row["oldest_age"])
