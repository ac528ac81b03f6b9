"""HTTP deliveries (``webhook_deliveries``, migration 0015_webhooks): what a deliverer
claims and settles, and what an operator revives (the endpoints' shared state:
``webhook_endpoints.py``).

A claim is a lease, as the relay's (``outbox.py``): due rows no lease holds, taken with
``SKIP LOCKED`` and stamped with the claimer's token until ``lease_until``, as many as
the endpoint's shared rate limit allows, in the statement that takes its tokens. Settling a
delivery (delivered, put off, dead) matches only while that lease holds: a deliverer
whose call outlived its lease settles nothing, and whoever claims the row next delivers
it again with the same ``webhook-id``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from service.adapters.postgres.dead_letter_rows import record_dead_letter
from service.adapters.postgres.pool import Connection, transaction
from service.adapters.postgres.webhook_endpoints import Tokens
from service.core.dead_letter import DeadLetterRecord
from service.core.default_owners import OwnerRule

# A claim within the endpoint's shared rate limit (``webhook_endpoints.py``), in one
# statement: the bucket refilled under its row's lock ($2 a second, up to $3) and what it
# grants now (up to $4; one, the probe, when a pause is over; none while the endpoint is
# disabled, held, paused or probed), that many due deliveries leased to $7 for $6 seconds
# (SKIP LOCKED), and the bucket less the tokens of those claimed (a grant that found
# nothing due costs nothing; a probe is out, for $5 seconds at most, only once claimed).
# One row per delivery claimed, or one with none; no row: the endpoint is not registered.
CLAIM = """
WITH bucket AS (
    SELECT name, paused_until, probing_until, held_until, disabled_at,
           least($3::float8, tokens + $2::float8 * greatest(0, extract(epoch FROM
                 clock_timestamp() - tokens_at)))::float8 AS have
      FROM webhook_endpoints WHERE name = $1
       FOR UPDATE
), granted AS (
    SELECT name, have, paused_until, probing_until, held_until, disabled_at,
           CASE WHEN disabled_at IS NOT NULL THEN 0
                WHEN held_until > clock_timestamp() THEN 0
                WHEN paused_until > clock_timestamp() THEN 0
                WHEN probing_until > clock_timestamp() THEN 0
                WHEN paused_until IS NOT NULL THEN least(floor(have), 1)
                ELSE least(floor(have), $4) END::int AS n
      FROM bucket
), next AS (
    SELECT id FROM webhook_deliveries
     WHERE endpoint = $1 AND NOT dead AND next_at <= now()
       AND (lease_until IS NULL OR lease_until < now())
     ORDER BY next_at
     LIMIT coalesce((SELECT n FROM granted), 0)
       FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE webhook_deliveries d
       SET lease_until = now() + make_interval(secs => $6), lease_token = $7
      FROM next
     WHERE d.id = next.id
    RETURNING d.id, d.message_id, d.reservation_id, d.hold_until, d.expired_at, d.traceparent,
              d.attempts, extract(epoch FROM now() - d.since)::float8 AS age, d.origin
), took AS (
    UPDATE webhook_endpoints w
       SET tokens = g.have - c.n, tokens_at = clock_timestamp(),
           probing_until = CASE WHEN g.paused_until IS NOT NULL AND c.n > 0
                                THEN clock_timestamp() + make_interval(secs => $5)
                                ELSE g.probing_until END
      FROM granted g, (SELECT count(*)::int AS n FROM claimed) c
     WHERE w.name = g.name
    RETURNING g.n AS granted, g.have::float8, g.paused_until IS NOT NULL AND c.n > 0 AS probe,
              g.disabled_at IS NOT NULL AS disabled,
              CASE WHEN g.n > 0 THEN 0
                   ELSE greatest(0, extract(epoch FROM greatest(g.paused_until,
                                                                w.probing_until, g.held_until)
                                                       - clock_timestamp())) END::float8 AS wait
)
SELECT t.granted, t.have, t.probe, t.disabled, t.wait, c.*
  FROM took t LEFT JOIN claimed c ON true
"""

# Settling: each records the attempt (whatever became of the claim: the request went out)
# and changes the delivery only while the claim's lease holds. $1 to $8 are the attempt's
# (``Attempted``; for a batch, each an array), $9 the delivery's id (a batch's: an array)
# and $10 the claim's token.
LOGGED = """
logged AS (
    INSERT INTO webhook_attempts (endpoint, message_id, attempt, kind, status, error_class,
                                  duration_ms, deliverer)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
)"""

# Delivered, a batch in one statement: the attempts logged; the deliveries whose lease
# holds deleted (the others, lapsed, stay: delivered again); each endpoint, which
# answered, no longer failing nor paused (the reset writes only when there is something
# to reset). Returns the ids deleted.
DELIVERED = """
WITH answered AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::int[], $4::text[], $5::int[], $6::text[],
                         $7::real[], $8::text[], $9::bigint[])
        AS a(endpoint, message_id, attempt, kind, status, error_class, duration_ms, deliverer,
             id)
), logged AS (
    INSERT INTO webhook_attempts (endpoint, message_id, attempt, kind, status, error_class,
                                  duration_ms, deliverer)
    SELECT endpoint, message_id, attempt, kind, status, error_class, duration_ms, deliverer
      FROM answered
), done AS (
    DELETE FROM webhook_deliveries d USING answered a
     WHERE d.id = a.id AND d.lease_token = $10 AND d.lease_until >= now()
 RETURNING d.id
), reset AS (
    UPDATE webhook_endpoints
       SET failures = 0, pauses = 0, paused_until = NULL, probing_until = NULL
     WHERE name IN (SELECT endpoint FROM answered)
       AND (failures > 0 OR pauses > 0 OR paused_until IS NOT NULL)
)
SELECT id FROM done
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
class Claim:
    """What a claim got: the bucket's grant (``Tokens``) and the deliveries claimed."""

    tokens: Tokens
    deliveries: list[Delivery]


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
    conn: Connection,
    endpoint: str,
    wanted: int,
    *,
    rate: float,
    burst: float,
    probe_seconds: float,
    lease_seconds: float,
    token: UUID,
) -> Claim:
    """Up to ``wanted`` due deliveries to ``endpoint`` that its shared bucket (``rate`` a
    second, up to ``burst``) allows now, leased to ``token``."""
    found = await conn.fetch(
        CLAIM, endpoint, rate, burst, wanted, probe_seconds, lease_seconds, token
    )
    if not found:  # retired (python -m service.deliver --retire) while this one ran
        return Claim(Tokens(0, 0.0, 0.0, registered=False), [])
    first = found[0]
    tokens = Tokens(
        first["granted"], first["have"], first["wait"], first["probe"], first["disabled"]
    )
    if first["id"] is None:
        return Claim(tokens, [])
    return Claim(tokens, [Delivery(*tuple(row)[5:]) for row in found])  # in Delivery's order


async def delivered(
    conn: Connection, delivery_id: int, *, token: UUID, attempted: Attempted
) -> bool:
    """Done (and the endpoint no longer failing), the attempt recorded: False when the
    lease had lapsed (another deliverer may send it again)."""
    return delivery_id in await delivered_all(conn, [(delivery_id, attempted)], token=token)


async def delivered_all(
    conn: Connection, answered: Sequence[tuple[int, Attempted]], *, token: UUID
) -> set[int]:
    """Deliveries answered 2xx (their ids and attempts), in one statement: every attempt
    recorded, each delivery done only while its lease holds (and each endpoint no longer
    failing). The ids done: one missing had lapsed (another deliverer may send it again)."""
    if not answered:
        return set()
    columns = list(zip(*(attempted.params() for _, attempted in answered), strict=True))
    ids = [delivery_id for delivery_id, _ in answered]
    found = await conn.fetch(DELIVERED, *map(list, columns), ids, token)
    return {row["id"] for row in found}


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
    async with transaction(conn):
        row = await conn.fetchrow(KILL, *attempted.params(), delivery_id, token)
        if row is None:
            return False
        await record_dead_letter(conn, dead_letter, owner=owner)
    return True


async def revive(conn: Connection, endpoint: str, message_id: str) -> bool:
    """A dead delivery due again (a replay); False when there is none."""
    return await conn.fetchval(REVIVE, endpoint, message_id) is not None
