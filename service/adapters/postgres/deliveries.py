"""HTTP deliveries (``webhook_deliveries``, migration 0015_webhooks): what a deliverer
claims and settles, and what an operator revives (the endpoints' shared state:
``webhook_endpoints.py``).

A claim is a lease, as the relay's (``outbox.py``): due rows no lease holds, taken with
``SKIP LOCKED`` and stamped with the claimer's token until ``lease_until``. Settling a
delivery (delivered, put off, dead) matches only while that lease holds: a deliverer
whose call outlived its lease settles nothing, and whoever claims the row next delivers
it again with the same ``webhook-id``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from service.adapters.postgres.dead_letter_rows import record_dead_letter
from service.adapters.postgres.pool import Connection
from service.core.dead_letter import DeadLetterRecord
from service.core.default_owners import OwnerRule

CLAIM = """
WITH next AS (
    SELECT id FROM webhook_deliveries
     WHERE endpoint = $1 AND NOT dead AND next_at <= now()
       AND (lease_until IS NULL OR lease_until < now())
     ORDER BY next_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
)
UPDATE webhook_deliveries d
   SET lease_until = now() + make_interval(secs => $3), lease_token = $4
  FROM next
 WHERE d.id = next.id
RETURNING d.id, d.message_id, d.reservation_id, d.hold_until, d.expired_at, d.traceparent,
          d.attempts, extract(epoch FROM now() - d.since)::float8 AS age
"""

# Settling: each matches only while the claim's lease holds.
# Delivered: the row goes, and the endpoint, which answered, is no longer failing nor
# paused (one round trip: the reset writes only when there is something to reset).
DELIVERED = """
WITH done AS (
    DELETE FROM webhook_deliveries
     WHERE id = $1 AND lease_token = $2 AND lease_until >= now()
 RETURNING id
), answered AS (
    UPDATE webhook_endpoints
       SET failures = 0, pauses = 0, paused_until = NULL, probing_until = NULL
     WHERE name = $3 AND (failures > 0 OR pauses > 0 OR paused_until IS NOT NULL)
)
SELECT count(*) FROM done
"""

PUT_OFF = """
UPDATE webhook_deliveries
   SET attempts = attempts + 1, next_at = now() + make_interval(secs => $3),
       lease_until = NULL, lease_token = NULL, last_status = $4, last_error = $5
 WHERE id = $1 AND lease_token = $2 AND lease_until >= now()
RETURNING id
"""

KILL = """
UPDATE webhook_deliveries
   SET attempts = attempts + 1, dead = true, lease_until = NULL, lease_token = NULL,
       last_status = $3, last_error = $4
 WHERE id = $1 AND lease_token = $2 AND lease_until >= now()
RETURNING id
"""

# An operator's replay: the dead delivery is due again, with fresh attempts and age.
REVIVE = """
UPDATE webhook_deliveries
   SET dead = false, attempts = 0, since = now(), next_at = now(),
       lease_until = NULL, lease_token = NULL
 WHERE endpoint = $1 AND message_id = $2 AND dead
RETURNING id
"""


@dataclass(frozen=True)
class Delivery:
    """A claimed delivery of one event to one endpoint."""

    id: int
    message_id: str
    reservation_id: UUID
    hold_until: datetime
    expired_at: datetime
    traceparent: str | None
    attempts: int  # before this one
    age: float  # seconds since its age budget started


async def claim(
    conn: Connection, endpoint: str, limit: int, *, lease_seconds: float, token: UUID
) -> list[Delivery]:
    """Up to ``limit`` due deliveries to ``endpoint``, leased to ``token``."""
    rows = await conn.fetch(CLAIM, endpoint, limit, lease_seconds, token)
    return [Delivery(**dict(row)) for row in rows]


async def delivered(conn: Connection, endpoint: str, delivery_id: int, *, token: UUID) -> bool:
    """Done (and the endpoint no longer failing): False when the lease had lapsed (another
    deliverer may send it again)."""
    done: int = await conn.fetchval(DELIVERED, delivery_id, token, endpoint)
    return done > 0


async def put_off(
    conn: Connection,
    delivery_id: int,
    *,
    token: UUID,
    seconds: float,
    status: int | None,
    error_class: str,
) -> bool:
    """Tried again in ``seconds``: False when the lease had lapsed."""
    row = await conn.fetchval(PUT_OFF, delivery_id, token, seconds, status, error_class)
    return row is not None


async def kill(
    conn: Connection,
    delivery_id: int,
    *,
    token: UUID,
    status: int | None,
    dead_letter: DeadLetterRecord,
    owner: OwnerRule | None,
) -> bool:
    """A dead letter: the delivery kept (for a replay) and recorded with the command's,
    in one transaction. False when the lease had lapsed (nothing is recorded)."""
    async with conn.transaction():
        row = await conn.fetchrow(KILL, delivery_id, token, status, dead_letter.error_class)
        if row is None:
            return False
        await record_dead_letter(conn, dead_letter, owner=owner)
    return True


async def revive(conn: Connection, endpoint: str, message_id: str) -> bool:
    """A dead delivery due again (a replay); False when there is none."""
    return await conn.fetchval(REVIVE, endpoint, message_id) is not None
