"""The attempt log (``webhook_attempts``, migration 0017) as an operator reads it: one
event's attempts to every endpoint, and where each of its deliveries stands.

The deliverer writes the log in the statements that settle its attempts
(``deliveries.py``); retention drops it a week at a time with the audit trail.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from service.adapters.postgres.pool import Connection

# The events an operator names: by its message id (the webhook-id), or by its hold's
# reservation id; pending or sent.
EVENTS_OF = """
SELECT message_id, reservation_id, expired_at, created_at, 'pending' AS state
  FROM expiry_events WHERE message_id = $1 OR reservation_id::text = $1
UNION ALL
SELECT message_id, reservation_id, expired_at, created_at, 'sent'
  FROM expiry_events_sent WHERE message_id = $1 OR reservation_id::text = $1
ORDER BY created_at
"""

ATTEMPTS_OF = """
SELECT endpoint, at, attempt, kind, status, error_class, duration_ms::float8, deliverer
  FROM webhook_attempts WHERE message_id = $1
 ORDER BY at, id
"""

DELIVERIES_OF = """
SELECT endpoint, dead, attempts, next_at, last_status, last_error, origin
  FROM webhook_deliveries WHERE message_id = $1
 ORDER BY endpoint
"""


@dataclass(frozen=True)
class Event:
    """An event the outbox holds, pending or sent."""

    message_id: str
    reservation_id: object
    expired_at: datetime
    created_at: datetime
    state: str  # pending or sent (to the broker)


@dataclass(frozen=True)
class LoggedAttempt:
    """One attempt of the log."""

    endpoint: str
    at: datetime
    attempt: int
    kind: str
    status: int | None
    error_class: str | None
    duration_ms: float
    deliverer: str


@dataclass(frozen=True)
class Waiting:
    """A delivery not made yet: pending (its next attempt's time) or dead."""

    endpoint: str
    dead: bool
    attempts: int
    next_at: datetime
    last_status: int | None
    last_error: str | None
    origin: str


async def events_of(conn: Connection, name: str) -> list[Event]:
    """The events a message id or a reservation id names (none: unknown, or no longer
    kept)."""
    return [Event(**dict(row)) for row in await conn.fetch(EVENTS_OF, name)]


async def attempts_of(conn: Connection, message_id: str) -> list[LoggedAttempt]:
    """Every attempt of the event, to every endpoint, oldest first."""
    return [LoggedAttempt(**dict(row)) for row in await conn.fetch(ATTEMPTS_OF, message_id)]


async def waiting_of(conn: Connection, message_id: str) -> list[Waiting]:
    """The event's deliveries not made yet, by endpoint."""
    return [Waiting(**dict(row)) for row in await conn.fetch(DELIVERIES_OF, message_id)]
