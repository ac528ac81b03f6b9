"""Publish leases: the scan's claims on due holds, recorded or released."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from uuid import UUID

from service.adapters.postgres.pool import Connection

EPOCH_START = datetime(1, 1, 1, tzinfo=UTC)


NIL_UUID = UUID(int=0)


# One keyset page of due, held reservations without a live lease and not parked
# (a closed dead letter's hold), oldest deadline first, locked (until the claim
# commits) so that an overlapping scan skips them.
CLAIM_DUE = """
SELECT r.id, r.hold_until
  FROM reservations r
 WHERE r.status = 'held'
   AND r.hold_until <= $1
   AND (r.hold_until, r.id) > ($2, $3)
   AND NOT EXISTS (SELECT 1 FROM publish_leases l
                    WHERE l.reservation_id = r.id AND l.lease_until > now())
   AND NOT EXISTS (SELECT 1 FROM parked_holds p WHERE p.reservation_id = r.id)
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


# The broker confirmed these: the lease now runs for the full lease length. A
# hold published before (its lease lapsed while it stayed held: the command was
# lost, stuck, or dead-lettered) is counted.
RECORD_LEASES = """
WITH recorded AS (
    UPDATE publish_leases
       SET lease_until = clock_timestamp() + make_interval(secs => $2),
           first_published = coalesce(first_published, clock_timestamp()),
           last_published = clock_timestamp(),
           publish_count = publish_count + 1
     WHERE reservation_id = ANY($1::uuid[])
 RETURNING publish_count
)
SELECT count(*) FILTER (WHERE publish_count > 1) FROM recorded
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


async def record_leases(conn: Connection, ids: Sequence[UUID], *, lease_seconds: int) -> int:
    """Record that these commands were confirmed by the broker; how many of them were
    published again after their lease lapsed."""
    lapsed: int = await conn.fetchval(RECORD_LEASES, list(ids), float(lease_seconds))
    return lapsed


async def release_claims(conn: Connection, ids: Sequence[UUID]) -> None:
    """These were not confirmed: the next scan may publish them again."""
    await conn.execute(RELEASE_CLAIMS, list(ids))


class PassResult(StrEnum):
    """How a scan pass ended, as ``scan_passes.result`` stores it."""

    OK = "ok"
    UNCONFIRMED = "unconfirmed"  # some commands were not confirmed by the broker
    STOPPED = "stopped"  # a signal stopped it before its last page
    FAILED = "failed"  # it raised after reaching the database


# The passes that did not do their job: the next pass must publish what they left.
FAILED_RESULTS = frozenset({PassResult.UNCONFIRMED, PassResult.FAILED})


RECORD_PASS = """
INSERT INTO scan_passes (scanner, started_at, result, published, unconfirmed)
VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (scanner) DO UPDATE
   SET started_at = EXCLUDED.started_at, finished_at = now(), result = EXCLUDED.result,
       published = EXCLUDED.published, unconfirmed = EXCLUDED.unconfirmed
"""
# Ages by the database's clock, which also stamped the passes.
LAST_PASSES = """
SELECT scanner, started_at, finished_at, result, published, unconfirmed,
       extract(epoch FROM now() - finished_at)::float8 AS age_seconds
  FROM scan_passes ORDER BY finished_at DESC LIMIT $1
"""
# How long ago the scan last recorded a confirmed page (NULL: never): a long pass
# records its pass only at its end, but each of its pages here as it goes.
NEWEST_PUBLISH_AGE = """
SELECT extract(epoch FROM now() - max(last_published))::float8 FROM publish_leases
"""


@dataclass(frozen=True)
class ScanPass:
    """One scanner's last pass: when it started (None: recorded before that was kept) and
    ended, how it went, and how long ago it ended."""

    scanner: str
    started_at: datetime | None
    finished_at: datetime
    result: str
    published: int
    unconfirmed: int
    age_seconds: float

    @property
    def failed(self) -> bool:
        return self.result in FAILED_RESULTS


async def record_pass(
    conn: Connection,
    scanner: str,
    *,
    started_at: datetime | None,
    result: PassResult,
    published: int,
    unconfirmed: int,
) -> None:
    """Remember how this scanner's last pass went (one row per scanner)."""
    await conn.execute(RECORD_PASS, scanner, started_at, result.value, published, unconfirmed)


async def last_passes(conn: Connection, limit: int = 5) -> list[ScanPass]:
    """The scanners' last passes, the newest first."""
    return [ScanPass(**dict(row)) for row in await conn.fetch(LAST_PASSES, limit)]


async def newest_publish_age(conn: Connection) -> float | None:
    """Seconds since the scan last recorded a confirmed command (None: never)."""
    age: float | None = await conn.fetchval(NEWEST_PUBLISH_AGE)
    return age
