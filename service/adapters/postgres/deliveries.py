"""HTTP deliveries (``webhook_endpoints``, ``webhook_deliveries``, migration
0015_webhooks): what a deliverer registers, shares, claims and settles, and what an
operator revives.

A claim is a lease, as the relay's (``outbox.py``): due rows no lease holds, taken with
``SKIP LOCKED`` and stamped with the claimer's token until ``lease_until``. Settling a
delivery (delivered, put off, dead) matches only while that lease holds: a deliverer
whose call outlived its lease settles nothing, and whoever claims the row next delivers
it again with the same ``webhook-id``.

The rate limit is a token bucket per endpoint in its row, shared by every deliverer:
whoever takes tokens refills it first (``rate`` a second since it was last refilled, up
to ``burst``); the row lock orders them. A paused endpoint gives no tokens; when its
pause is over, the first to ask gets one token (the probe), and nobody else gets any
until the probe's answer (or its lease's end): a 2xx ends the pause, a failure starts a
longer one. Failures of attempts that were in flight when a pause began count for
nothing: they say nothing the pause did not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from service.adapters.postgres.dead_letter_rows import record_dead_letter
from service.adapters.postgres.pool import Connection
from service.core.dead_letter import DeadLetterRecord
from service.core.default_owners import OwnerRule

REGISTER = """
INSERT INTO webhook_endpoints (name) SELECT unnest($1::text[])
    ON CONFLICT (name) DO UPDATE SET seen_at = now()
"""

TAKE_TOKENS = """
WITH bucket AS (
    SELECT name, paused_until, probing_until,
           least($3::float8, tokens + $2::float8 * greatest(0, extract(epoch FROM
                 clock_timestamp() - tokens_at)))::float8 AS have
      FROM webhook_endpoints WHERE name = $1
       FOR UPDATE
), granted AS (
    SELECT name, have, paused_until, probing_until,
           CASE WHEN paused_until > clock_timestamp() THEN 0
                WHEN probing_until > clock_timestamp() THEN 0
                WHEN paused_until IS NOT NULL THEN least(floor(have), 1)
                ELSE least(floor(have), $4) END::int AS n
      FROM bucket
)
UPDATE webhook_endpoints w
   SET tokens = g.have - g.n, tokens_at = clock_timestamp(),
       probing_until = CASE WHEN g.paused_until <= clock_timestamp() AND g.n > 0
                            THEN clock_timestamp() + make_interval(secs => $5)
                            ELSE g.probing_until END
  FROM granted g
 WHERE w.name = g.name
RETURNING g.n, g.have::float8,
          greatest(0, extract(epoch FROM greatest(g.paused_until, w.probing_until)
                                         - clock_timestamp()))::float8 AS paused
"""

GIVE_BACK = """
UPDATE webhook_endpoints SET tokens = least($3::float8, tokens + $2) WHERE name = $1
"""

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

# The endpoint answered (whatever it said): its failures in a row end, and any pause.
ANSWERED = """
UPDATE webhook_endpoints
   SET failures = 0, pauses = 0, paused_until = NULL, probing_until = NULL
 WHERE name = $1 AND (failures > 0 OR pauses > 0 OR paused_until IS NOT NULL)
"""

# A retryable failure. While the endpoint is paused, nothing (an attempt that was in
# flight when the pause began says nothing new). Else one more in a row; at $2 in a row,
# or when the probe is out (it failed, or another attempt did meanwhile), the endpoint
# pauses: $3 seconds the first time in a row, twice as long each time, up to $4.
FAILED = """
WITH before AS (
    SELECT name, failures, pauses,
           coalesce(paused_until > clock_timestamp(), false) AS paused,
           coalesce(probing_until > clock_timestamp(), false) AS probing
      FROM webhook_endpoints WHERE name = $1
       FOR UPDATE
), next AS (
    SELECT name, pauses, paused, NOT paused AND (probing OR failures + 1 >= $2) AS pause,
           failures
      FROM before
)
UPDATE webhook_endpoints w
   SET failures = CASE WHEN n.paused THEN w.failures WHEN n.pause THEN 0
                       ELSE n.failures + 1 END,
       paused_until = CASE WHEN n.pause THEN clock_timestamp() + make_interval(
                                secs => least($4::float8, $3::float8 * 2 ^ least(n.pauses, 30)))
                           ELSE w.paused_until END,
       probing_until = CASE WHEN n.pause THEN NULL ELSE w.probing_until END,
       pauses = CASE WHEN n.pause THEN n.pauses + 1 ELSE n.pauses END
  FROM next n
 WHERE w.name = n.name
RETURNING n.pause AS paused
"""

# An operator's replay: the dead delivery is due again, with fresh attempts and age.
REVIVE = """
UPDATE webhook_deliveries
   SET dead = false, attempts = 0, since = now(), next_at = now(),
       lease_until = NULL, lease_token = NULL
 WHERE endpoint = $1 AND message_id = $2 AND dead
RETURNING id
"""

# Retiring an endpoint: no delivery is written for it any more, and its deliveries go.
RETIRE = """
WITH endpoint AS (
    DELETE FROM webhook_endpoints WHERE name = $1 RETURNING name
), gone AS (
    DELETE FROM webhook_deliveries WHERE endpoint = $1 RETURNING dead
)
SELECT (SELECT count(*) FROM endpoint) AS registered,
       (SELECT count(*) FILTER (WHERE NOT dead) FROM gone) AS pending,
       (SELECT count(*) FILTER (WHERE dead) FROM gone) AS dead
"""

BACKLOG = """
SELECT w.name AS endpoint, count(d.id) FILTER (WHERE NOT d.dead) AS pending,
       count(d.id) FILTER (WHERE d.dead) AS dead,
       coalesce(extract(epoch FROM now() - min(d.created_at) FILTER (WHERE NOT d.dead)), 0)
           ::float8 AS oldest_age,
       greatest(0, extract(epoch FROM greatest(w.paused_until, w.probing_until) - now()))
           ::float8 AS paused_for
  FROM webhook_endpoints w
  LEFT JOIN webhook_deliveries d ON d.endpoint = w.name
 GROUP BY w.name, w.paused_until, w.probing_until
 ORDER BY w.name
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


@dataclass(frozen=True)
class Tokens:
    """What a deliverer may send now: ``granted`` requests; the bucket held ``have``;
    the endpoint is paused for ``paused`` more seconds."""

    granted: int
    have: float
    paused: float
    registered: bool = True  # False: the endpoint was retired (--retire)


@dataclass(frozen=True)
class EndpointBacklog:
    """One endpoint's deliveries: pending, dead, the oldest pending's age, its pause."""

    endpoint: str
    pending: int
    dead: int
    oldest_age: float
    paused_for: float


async def register(conn: Connection, names: Sequence[str]) -> None:
    """The endpoints a deliverer serves: deliveries are written for them from now on."""
    await conn.execute(REGISTER, list(names))


async def take_tokens(
    conn: Connection, name: str, *, rate: float, burst: float, wanted: int, probe_seconds: float
) -> Tokens:
    """Up to ``wanted`` requests' worth of the endpoint's shared bucket."""
    row = await conn.fetchrow(TAKE_TOKENS, name, rate, burst, wanted, probe_seconds)
    if row is None:  # retired (python -m service.deliver --retire) while this one ran
        return Tokens(0, 0.0, 0.0, registered=False)
    return Tokens(row["n"], row["have"], row["paused"])


async def give_back(conn: Connection, name: str, tokens: int, *, burst: float) -> None:
    """Tokens taken and not used."""
    if tokens > 0:
        await conn.execute(GIVE_BACK, name, float(tokens), burst)


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


async def answered(conn: Connection, endpoint: str) -> None:
    """The endpoint answered: no longer failing, nor paused."""
    await conn.execute(ANSWERED, endpoint)


async def failed(
    conn: Connection, endpoint: str, *, pause_after: int, first: float, cap: float
) -> bool:
    """One more retryable failure; True when it paused the endpoint (for ``first`` seconds
    the first time in a row, twice as long each time, up to ``cap``)."""
    row = await conn.fetchrow(FAILED, endpoint, pause_after, first, cap)
    return bool(row is not None and row["paused"])


async def revive(conn: Connection, endpoint: str, message_id: str) -> bool:
    """A dead delivery due again (a replay); False when there is none."""
    return await conn.fetchval(REVIVE, endpoint, message_id) is not None


async def retire(conn: Connection, endpoint: str) -> tuple[int, int, int]:
    """The endpoint unregistered and its deliveries deleted: (registered, pending, dead)
    as they were."""
    row = await conn.fetchrow(RETIRE, endpoint)
    assert row is not None
    return row["registered"], row["pending"], row["dead"]


async def backlog(conn: Connection) -> list[EndpointBacklog]:
    """Each registered endpoint's deliveries."""
    return [EndpointBacklog(**dict(row)) for row in await conn.fetch(BACKLOG)]
