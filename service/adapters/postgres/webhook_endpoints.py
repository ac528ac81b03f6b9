"""The webhook endpoints' shared state (``webhook_endpoints``, migrations 0015 and 0016):
what every deliverer registers and shares about each endpoint, and what an operator
reads and changes of it.

The rate limit is a token bucket per endpoint in its row, shared by every deliverer:
whoever takes tokens refills it first (``rate`` a second since it was last refilled, up
to ``burst``); the row lock orders them. Tokens are taken in the statement that claims
the deliveries they allow (``deliveries.CLAIM``), only for those it claimed. No tokens
are given while the endpoint is disabled (it answered 410 Gone: until ``python -m
service.deliver --enable``), held (a ``Retry-After`` it asked for) or paused (failures in
a row). When a pause is over, the
first to ask gets one token (the probe), and nobody else gets any until the probe's
answer (or its lease's end): a 2xx ends the pause, a failure starts a longer one; a
probe that finds nothing due is not taken. Failures of attempts that were in flight
when a pause began count for nothing: they say nothing the pause did not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from service.adapters.postgres.pool import Connection

REGISTER = """
INSERT INTO webhook_endpoints (name) SELECT unnest($1::text[])
    ON CONFLICT (name) DO UPDATE SET seen_at = now()
"""

# A failure. While the endpoint is paused, nothing (an attempt that was in flight when
# the pause began says nothing new). Else one more in a row; at $2 in a row, or when the
# probe is out (it failed, or another attempt did meanwhile), the endpoint pauses: $3
# seconds the first time in a row, twice as long each time, up to $4.
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

# A Retry-After: no deliverer sends to the endpoint before then (a later one wins).
HOLD = """
UPDATE webhook_endpoints
   SET held_until = greatest(held_until, clock_timestamp() + make_interval(secs => $2))
 WHERE name = $1
"""

# 410 Gone: disabled, unless it is already (then nothing: the first one's time stays).
DISABLE = """
UPDATE webhook_endpoints w
   SET disabled_at = clock_timestamp()
  FROM (SELECT name FROM webhook_endpoints WHERE name = $1 AND disabled_at IS NULL
          FOR UPDATE) b
 WHERE w.name = b.name
RETURNING w.name
"""

# --enable: sent to again, as new: no failures, pause or hold. Its waiting deliveries are
# due now, and the time it was disabled does not count against their age budget (one
# written meanwhile starts its budget now).
ENABLE = """
WITH was AS (
    SELECT name, disabled_at FROM webhook_endpoints WHERE name = $1 FOR UPDATE
), enabled AS (
    UPDATE webhook_endpoints w
       SET disabled_at = NULL, failures = 0, pauses = 0, paused_until = NULL,
           probing_until = NULL, held_until = NULL
      FROM was
     WHERE w.name = was.name AND was.disabled_at IS NOT NULL
    RETURNING w.name
), due AS (
    UPDATE webhook_deliveries d
       SET since = least(d.since + (clock_timestamp() - was.disabled_at), clock_timestamp()),
           next_at = least(d.next_at, now())
      FROM was
     WHERE d.endpoint = was.name AND was.disabled_at IS NOT NULL AND NOT d.dead
    RETURNING d.id
)
SELECT (SELECT count(*) FROM was) AS registered, (SELECT disabled_at FROM was) AS disabled_at,
       (SELECT count(*) FROM due) AS pending
"""

# Retiring takes the endpoints' table alone for its transaction: an expiry whose trigger
# read the names (it writes a delivery per endpoint) commits first, and one after reads
# them without this endpoint, so that no delivery is left behind for an endpoint gone.
LOCK_ALL = "LOCK TABLE webhook_endpoints IN ACCESS EXCLUSIVE MODE"

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

# Per endpoint, from the partial indexes on (endpoint, since) and (endpoint): no scan of
# every delivery. The oldest pending is aged from its budget's start (a replay's, or
# created_at).
IS_REGISTERED = "SELECT EXISTS (SELECT FROM webhook_endpoints WHERE name = $1)"

BACKLOG = """
SELECT w.name AS endpoint, p.pending, d.dead,
       coalesce(extract(epoch FROM now() - p.oldest), 0)::float8 AS oldest_age,
       greatest(0, extract(epoch FROM greatest(w.paused_until, w.probing_until) - now()))
           ::float8 AS paused_for,
       w.disabled_at
  FROM webhook_endpoints w
 CROSS JOIN LATERAL (SELECT count(*) AS pending, min(since) AS oldest
                       FROM webhook_deliveries WHERE endpoint = w.name AND NOT dead) p
 CROSS JOIN LATERAL (SELECT count(*) AS dead
                       FROM webhook_deliveries WHERE endpoint = w.name AND dead) d
 ORDER BY w.name
"""


@dataclass(frozen=True)
class Tokens:
    """What a deliverer may send now: ``granted`` requests (one when a pause is over:
    ``probe`` once it is claimed); the bucket held ``have``; with none granted, the
    endpoint is held or paused for ``wait`` more seconds, or ``disabled``."""

    granted: int
    have: float
    wait: float
    probe: bool = False
    disabled: bool = False
    registered: bool = True  # False: the endpoint was retired (--retire)


@dataclass(frozen=True)
class EndpointBacklog:
    """One endpoint's deliveries: pending, dead, the oldest pending's age (since its age
    budget started: its event's writing, or its replay), its pause, and since when it is
    disabled (None: it is not)."""

    endpoint: str
    pending: int
    dead: int
    oldest_age: float
    paused_for: float
    disabled_at: datetime | None = None


@dataclass(frozen=True)
class Enabled:
    """What ``--enable`` found: whether the endpoint is registered, since when it was
    disabled (None: it was not, and nothing changed), its deliveries now due."""

    registered: bool
    disabled_at: datetime | None
    pending: int


async def register(conn: Connection, names: Sequence[str]) -> None:
    """The endpoints a deliverer serves: deliveries are written for them from now on."""
    await conn.execute(REGISTER, list(names))


async def failed(
    conn: Connection, endpoint: str, *, pause_after: int, first: float, cap: float
) -> bool:
    """One more failure; True when it paused the endpoint (for ``first`` seconds the
    first time in a row, twice as long each time, up to ``cap``)."""
    row = await conn.fetchrow(FAILED, endpoint, pause_after, first, cap)
    return bool(row is not None and row["paused"])


async def hold(conn: Connection, endpoint: str, seconds: float) -> None:
    """No deliverer sends to the endpoint for ``seconds`` (its ``Retry-After``)."""
    await conn.execute(HOLD, endpoint, seconds)


async def disable(conn: Connection, endpoint: str) -> bool:
    """Disabled (it answered 410 Gone); False when it already was."""
    return await conn.fetchval(DISABLE, endpoint) is not None


async def enable(conn: Connection, endpoint: str) -> Enabled:
    """Sent to again (``--enable``), its waiting deliveries due now."""
    row = await conn.fetchrow(ENABLE, endpoint)
    assert row is not None
    return Enabled(row["registered"] > 0, row["disabled_at"], row["pending"])


async def retire(conn: Connection, endpoint: str) -> tuple[int, int, int]:
    """The endpoint unregistered and its deliveries deleted, in the caller's transaction
    once the expiries in flight have committed (waiting at most the lock timeout):
    (registered, pending, dead) as they were."""
    await conn.execute(LOCK_ALL)
    row = await conn.fetchrow(RETIRE, endpoint)
    assert row is not None
    return row["registered"], row["pending"], row["dead"]


async def backlog(conn: Connection) -> list[EndpointBacklog]:
    """Each registered endpoint's deliveries."""
    return [EndpointBacklog(**dict(row)) for row in await conn.fetch(BACKLOG)]


async def is_registered(conn: Connection, name: str) -> bool:
    """Whether a deliverer registered an endpoint of this name (and it was not retired)."""
    return bool(await conn.fetchval(IS_REGISTERED, name))
