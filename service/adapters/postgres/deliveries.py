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
          d.attempts, extract(epoch FROM now() - d.since)::float8 AS age, d.origin
"""

# Settling: each records the attempt (whatever became of the claim: the request went out)
# and changes the delivery only while the claim's lease holds. $1 to $8 are the attempt's
# (``Attempted``), $9 the delivery's id and $10 the claim's token.
LOGGED = """
logged AS (
    INSERT INTO webhook_attempts (endpoint, message_id, attempt, kind, status, error_class,
                                  duration_ms, deliverer)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
)"""

# Delivered: the row goes, and the endpoint, which answered, is no longer failing nor
# paused (one round trip: the reset writes only when there is something to reset).
DELIVERED = f"""
WITH {LOGGED}, done AS (
    DELETE FROM webhook_deliveries
     WHERE id = $9 AND lease_token = $10 AND lease_until >= now()
 RETURNING id
), answered AS (
    UPDATE webhook_endpoints
       SET failures = 0, pauses = 0, paused_until = NULL, probing_until = NULL
     WHERE name = $1 AND (failures > 0 OR pauses > 0 OR paused_until IS NOT NULL)
)
SELECT count(*) FROM done
"""

PUT_OFF = f"""
WITH {LOGGED}
UPDATE webhook_deliveries
   SET attempts = attempts + 1, next_at = now() + make_interval(secs => $11),
       lease_until = NULL, lease_token = NULL, last_status = $5, last_error = $6
 WHERE id = $9 AND lease_token = $10 AND lease_until >= now()
RETURNING id
"""

KILL = f"""
WITH {LOGGED}
UPDATE webhook_deliveries
   SET attempts = attempts + 1, dead = true, lease_until = NULL, lease_token = NULL,
       last_status = $5, last_error = $6
 WHERE id = $9 AND lease_token = $10 AND lease_until >= now()
RETURNING id
"""

# An operator's replay: the dead delivery is due again, with fresh attempts and age.
REVIVE = """
UPDATE webhook_deliveries
   SET dead = false, attempts = 0, since = now(), next_at = now(),
       lease_until = NULL, lease_token = NULL, origin = 'replay'
 WHERE endpoint = $1 AND message_id = $2 AND dead
RETURNING id
"""

# What made an attempt (webhook_attempts.kind): its delivery's origin, or a probe.
AUTOMATIC, PROBE, REPLAY, BACKFILL = "automatic", "probe", "replay", "backfill"


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
    origin: str = AUTOMATIC  # what made it: automatic, replay or backfill


@dataclass(frozen=True)
class Attempted:
    """One attempt as the attempt log keeps it: never a body, a URL or a secret."""

    endpoint: str
    message_id: str
    number: int  # the delivery's attempt, from 1
    kind: str  # automatic, probe, replay or backfill
    status: int | None  # the HTTP status answered (None: no answer)
    error_class: str | None  # None: delivered
    duration_ms: float
    deliverer: str

    def params(self) -> tuple[object, ...]:
        """$1 to $8 of the settling statements."""
        return (
            self.endpoint,
            self.message_id,
            self.number,
            self.kind,
            self.status,
            self.error_class,
            self.duration_ms,
            self.deliverer,
        )


async def claim(
    conn: Connection, endpoint: str, limit: int, *, lease_seconds: float, token: UUID
) -> list[Delivery]:
    """Up to ``limit`` due deliveries to ``endpoint``, leased to ``token``."""
    rows = await conn.fetch(CLAIM, endpoint, limit, lease_seconds, token)
    return [Delivery(**dict(row)) for row in rows]


async def delivered(
    conn: Connection, delivery_id: int, *, token: UUID, attempted: Attempted
) -> bool:
    """Done (and the endpoint no longer failing), the attempt recorded: False when the
    lease had lapsed (another deliverer may send it again)."""
    done: int = await conn.fetchval(DELIVERED, *attempted.params(), delivery_id, token)
    return done > 0


async def put_off(
    conn: Connection, delivery_id: int, *, token: UUID, seconds: float, attempted: Attempted
) -> bool:
    """Tried again in ``seconds``, the attempt recorded: False when the lease had lapsed."""
    row = await conn.fetchval(PUT_OFF, *attempted.params(), delivery_id, token, seconds)
    return row is not None


async def kill(
    conn: Connection,
    delivery_id: int,
    *,
    token: UUID,
    attempted: Attempted,
    dead_letter: DeadLetterRecord,
    owner: OwnerRule | None,
) -> bool:
    """A dead letter: the delivery kept (for a replay) and recorded with the command's,
    and the attempt, in one transaction. False when the lease had lapsed (then only the
    attempt is recorded)."""
    async with conn.transaction():
        row = await conn.fetchrow(KILL, *attempted.params(), delivery_id, token)
        if row is None:
            return False
        await record_dead_letter(conn, dead_letter, owner=owner)
    return True


async def revive(conn: Connection, endpoint: str, message_id: str) -> bool:
    """A dead delivery due again (a replay); False when there is none."""
    return await conn.fetchval(REVIVE, endpoint, message_id) is not None
