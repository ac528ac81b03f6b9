"""The exactly-once proof from the audit trail, and the outbox's from it: whole-table
checks."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from service.adapters.postgres.pool import Connection

# Where the audit trail begins: the oldest partition of reservation_transitions (retention
# drops whole weeks before it). A hold due since then that expired has its transition
# inside the trail; one due before may have lost it to retention: verify proves the
# window only.
WINDOW_START = """(SELECT coalesce(min(expiry_partition_low(i.inhrelid)), '-infinity')
                    FROM pg_inherits i
                   WHERE i.inhparent = 'reservation_transitions'::regclass)"""
PROVEN_SINCE = f"SELECT {WINDOW_START}"

VERIFY_TOTALS = f"""
SELECT count(*) FILTER (WHERE status = 'held') AS held,
       count(*) FILTER (WHERE status = 'expired') AS expired,
       count(*) FILTER (WHERE status = 'consumed') AS consumed,
       (SELECT count(*) FROM reservation_transitions) AS transitions,
       count(*) FILTER (WHERE status = 'expired' AND hold_until < {WINDOW_START})
           AS expired_before_window
  FROM reservations
"""


# The start of the latest pass that succeeded (NULL: none, or none since started_at is
# kept). Every pass reads "now" first and claims every hold due by then without a live
# lease: a hold due, and its lease lapsed, before that start was one it had to publish.
LAST_OK_PASS_START = "(SELECT max(started_at) FROM scan_passes WHERE result = 'ok')"

# Due (past the scan interval's grace, the parameter {grace}), held, not parked, and no
# live lease.
UNLEASED_DUE = """
  FROM reservations r LEFT JOIN publish_leases l ON l.reservation_id = r.id
 WHERE r.status = 'held' AND r.hold_until <= now() - make_interval(secs => {grace})
   AND (l.lease_until IS NULL OR l.lease_until <= now())
   AND NOT EXISTS (SELECT 1 FROM parked_holds p WHERE p.reservation_id = r.id)
"""
# Of those, the ones a successful pass that started after they became due, after their
# lease lapsed and after they were inserted (a hold inserted already due, behind a pass's
# cursor, is the next pass's) left alone: a broken promise. The others await a scan.
LEFT_BY_A_PASS = f"greatest(r.hold_until, r.created_at, l.lease_until) <= {LAST_OK_PASS_START}"

# Each check lists its violations: (reservation id, a short fact).
VERIFY_CHECKS: dict[str, str] = {
    "expired-without-exactly-one-transition": f"""
        SELECT r.id, count(t.id)::text || ' expiring transitions' AS fact
          FROM reservations r
          LEFT JOIN reservation_transitions t
            ON t.reservation_id = r.id AND t.to_status = 'expired'
         WHERE r.status = 'expired' AND r.hold_until >= {WINDOW_START}
         GROUP BY r.id HAVING count(t.id) <> 1
         LIMIT $1
    """,
    "left-a-final-state": """
        SELECT t.reservation_id, 'transition ' || t.from_status || ' -> ' || t.to_status AS fact
          FROM reservation_transitions t WHERE t.from_status IN ('expired', 'consumed')
        UNION ALL
        SELECT r.id, 'expired once, now ' || r.status
          FROM reservations r
         WHERE r.status <> 'expired'
           AND EXISTS (SELECT 1 FROM reservation_transitions t
                        WHERE t.reservation_id = r.id AND t.to_status = 'expired')
         LIMIT $1
    """,
    "expired-before-deadline": """
        SELECT r.id, 'expired ' || (r.hold_until - t.at)::text || ' early' AS fact
          FROM reservation_transitions t JOIN reservations r ON r.id = t.reservation_id
         WHERE t.to_status = 'expired' AND t.at < r.hold_until
         LIMIT $1
    """,
    "due-without-live-lease": f"""
        SELECT r.id, 'due for ' || date_trunc('second', now() - r.hold_until)::text
                     || ', lease ' || coalesce('lapsed ' || l.lease_until::text, 'never taken')
                     || ', left by a scan pass that started '
                     || date_trunc('second', now() - {LAST_OK_PASS_START})::text || ' ago'
        {UNLEASED_DUE.format(grace="$2")}
           AND {LEFT_BY_A_PASS}
         LIMIT $1
    """,
}

# The due holds no successful pass has covered yet: how many, the oldest deadline.
AWAITING_SCAN = f"""
SELECT count(*) AS holds, min(r.hold_until) AS oldest_due,
       extract(epoch FROM now() - min(r.hold_until))::float8 AS oldest_due_seconds
{UNLEASED_DUE.format(grace="$1")}
   AND NOT coalesce({LEFT_BY_A_PASS}, false)
"""


# The outbox (migration 0014_events): every held -> expired transition since the outbox
# exists has exactly one event, pending (expiry_events) or sent (expiry_events_sent); no
# event lacks its expiry; none stays pending past a bound. Compared in the window the
# three have in common: the audit trail's, the sent events' record (retention drops its
# weeks by when they were sent, which may be after the trail's), and the outbox's own
# (the migration's start, and a second's margin for a writer whose statement began in
# the instant before the migration locked the trail; expiries before it have no event).
EVENTS_SINCE = f"""greatest(
    {WINDOW_START},
    (SELECT coalesce(min(expiry_partition_low(i.inhrelid)), '-infinity')
       FROM pg_inherits i WHERE i.inhparent = 'expiry_events_sent'::regclass),
    (SELECT applied_at + interval '1 second' FROM schema_migrations
      WHERE version = '0014_events'))"""
# The event's message id, as the trigger makes it from the hold (core/events.py too).
EXPECTED_EVENT_ID = (
    "'expired:' || r.id || ':' || round(extract(epoch FROM r.hold_until) * 1000)::bigint"
)
EVENTS = """(SELECT reservation_id, message_id, expired_at, 'pending' AS state FROM expiry_events
             UNION ALL
             SELECT reservation_id, message_id, expired_at, 'sent' FROM expiry_events_sent)"""

EVENTS_WRITTEN = """(SELECT reservation_id, message_id, created_at, 'pending' AS state
               FROM expiry_events
             UNION ALL
             SELECT reservation_id, message_id, created_at, 'sent' FROM expiry_events_sent)"""
# The webhooks' check looks at events from when the attempt log exists (migration 0017:
# a delivery made before it left no attempt) and as far back as it keeps attempts.
WEBHOOKS_SINCE = f"""greatest(
    {EVENTS_SINCE},
    (SELECT coalesce(min(expiry_partition_low(i.inhrelid)), '-infinity')
       FROM pg_inherits i WHERE i.inhparent = 'webhook_attempts'::regclass),
    (SELECT applied_at + interval '1 minute' FROM schema_migrations
      WHERE version = '0017_webhook_attempts'))"""

# Each lists its violations: (reservation id, a short fact); $1 the limit, $2 (the last)
# the age in seconds past which a pending event is a violation.
EVENT_CHECKS: dict[str, str] = {
    "expired-without-exactly-one-event": f"""
        WITH expired AS (
            SELECT DISTINCT t.reservation_id FROM reservation_transitions t
             WHERE t.from_status = 'held' AND t.to_status = 'expired' AND t.at >= {EVENTS_SINCE}
        )
        SELECT x.reservation_id, count(e.message_id)::text || ' event(s) with its message id'
          FROM expired x
          JOIN reservations r ON r.id = x.reservation_id
          LEFT JOIN {EVENTS} e
            ON e.reservation_id = x.reservation_id AND e.message_id = {EXPECTED_EVENT_ID}
         GROUP BY x.reservation_id HAVING count(e.message_id) <> 1
         LIMIT $1
    """,
    "event-without-its-expiry": f"""
        SELECT e.reservation_id, e.state || ' event ' || e.message_id || ': '
               || CASE WHEN r.id IS NULL THEN 'no such reservation'
                       WHEN e.message_id <> {EXPECTED_EVENT_ID} THEN 'not its hold''s message id'
                       ELSE 'no expiry recorded at ' || e.expired_at::text END
          FROM {EVENTS} e LEFT JOIN reservations r ON r.id = e.reservation_id
         WHERE e.expired_at >= {EVENTS_SINCE}
           AND (r.id IS NULL OR e.message_id <> {EXPECTED_EVENT_ID}
                OR NOT EXISTS (SELECT 1 FROM reservation_transitions t
                                WHERE t.reservation_id = e.reservation_id
                                  AND t.from_status = 'held' AND t.to_status = 'expired'
                                  AND t.at = e.expired_at))
         LIMIT $1
    """,
    # Every event reached every endpoint registered a minute before it was written (an
    # expiry's transaction is over within the statement timeouts: one registered in the
    # same moment may have been read by it or not): its delivery waits (pending or dead),
    # or an attempt of it was answered 2xx. From when the attempt log exists.
    "event-without-its-webhook": f"""
        SELECT e.reservation_id, e.state || ' event ' || e.message_id || ': endpoint '
               || w.name || ' has neither its delivery (pending or dead) nor a 2xx attempt'
          FROM {EVENTS_WRITTEN} e
          JOIN webhook_endpoints w ON w.registered_at < e.created_at - interval '1 minute'
         WHERE e.created_at >= {WEBHOOKS_SINCE}
           AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d
                            WHERE d.endpoint = w.name AND d.message_id = e.message_id)
           AND NOT EXISTS (SELECT 1 FROM webhook_attempts a
                            WHERE a.endpoint = w.name AND a.message_id = e.message_id
                              AND a.status BETWEEN 200 AND 299)
         LIMIT $1
    """,
    "event-pending-too-long": """
        SELECT reservation_id, 'pending for ' || date_trunc('second', now() - created_at)::text
               || ' (' || message_id || ', claimed ' || claims || ' time(s))'
          FROM expiry_events WHERE created_at < now() - make_interval(secs => $2)
         ORDER BY created_at
         LIMIT $1
    """,
}
EVENT_TOTALS = f"""
SELECT (SELECT count(*) FROM expiry_events) AS pending,
       (SELECT count(*) FROM expiry_events_sent) AS sent,
       (SELECT extract(epoch FROM now() - min(created_at))::float8 FROM expiry_events)
           AS oldest_pending_seconds,
       {EVENTS_SINCE} AS since
"""


# Whole-table checks: hash and merge joins (a nested loop over a table without
# statistics yet can take minutes), and more time than a single update gets.
VERIFY_SESSION = "SET LOCAL enable_nestloop = off; SET LOCAL statement_timeout = '10min'"


async def proven_since(conn: Connection) -> datetime | None:
    """Where the audit trail begins (None: it keeps everything, as far back as it goes)."""
    since: datetime | None = await conn.fetchval(PROVEN_SINCE)
    return None if since is None or since.year == 1 else since  # -infinity: no partition


async def prepare_verification(conn: Connection) -> None:
    """Session settings for the verification queries (inside their transaction)."""
    await conn.execute(VERIFY_SESSION)


async def verify_totals(conn: Connection) -> dict[str, int]:
    """Reservations by status and the number of audited transitions."""
    row = await conn.fetchrow(VERIFY_TOTALS)
    return dict(row) if row else {}


@dataclass(frozen=True)
class AwaitingScan:
    """Due holds without a live lease that no successful pass has covered yet."""

    holds: int
    oldest_due: datetime | None
    oldest_due_seconds: float | None


async def awaiting_scan(conn: Connection, *, scan_interval: float) -> AwaitingScan:
    """The due holds that await a scan (past the scan interval's grace)."""
    row = await conn.fetchrow(AWAITING_SCAN, scan_interval)
    if row is None:
        return AwaitingScan(0, None, None)
    return AwaitingScan(row["holds"], row["oldest_due"], row["oldest_due_seconds"])


async def verify_check(
    conn: Connection, name: str, *, limit: int, scan_interval: float
) -> list[tuple[UUID, str]]:
    """The violations of one named check (at most ``limit``)."""
    sql = VERIFY_CHECKS[name]
    args: tuple[object, ...] = (limit, scan_interval) if "$2" in sql else (limit,)
    return [(row[0], row[1]) for row in await conn.fetch(sql, *args)]


@dataclass(frozen=True)
class EventTotals:
    """The outbox as verify sees it: what waits, what was sent, and since when each
    expiry must have its event (None: since always)."""

    pending: int
    sent: int
    oldest_pending_seconds: float | None  # None: nothing pending
    since: datetime | None


async def event_totals(conn: Connection) -> EventTotals:
    """The outbox's counts and the window its checks cover."""
    row = await conn.fetchrow(EVENT_TOTALS)
    assert row is not None  # scalar subqueries: always a row
    since: datetime | None = row["since"]
    if since is not None and since.year == 1:  # -infinity
        since = None
    return EventTotals(row["pending"], row["sent"], row["oldest_pending_seconds"], since)


async def verify_event_check(
    conn: Connection, name: str, *, limit: int, pending_bound: float
) -> list[tuple[UUID, str]]:
    """The violations of one of the outbox's checks (at most ``limit``); a pending event
    older than ``pending_bound`` seconds is one."""
    sql = EVENT_CHECKS[name]
    args: tuple[object, ...] = (limit, pending_bound) if "$2" in sql else (limit,)
    return [(row[0], row[1]) for row in await conn.fetch(sql, *args)]
