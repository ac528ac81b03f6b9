"""The exactly-once proof from the audit trail: whole-table checks."""

from __future__ import annotations

from uuid import UUID

from service.adapters.postgres.pool import Connection

VERIFY_TOTALS = """
SELECT count(*) FILTER (WHERE status = 'held') AS held,
       count(*) FILTER (WHERE status = 'expired') AS expired,
       count(*) FILTER (WHERE status = 'consumed') AS consumed,
       (SELECT count(*) FROM reservation_transitions) AS transitions
  FROM reservations
"""


# Each check lists its violations: (reservation id, a short fact).
VERIFY_CHECKS: dict[str, str] = {
    "expired-without-exactly-one-transition": """
        SELECT r.id, count(t.id)::text || ' expiring transitions' AS fact
          FROM reservations r
          LEFT JOIN reservation_transitions t
            ON t.reservation_id = r.id AND t.to_status = 'expired'
         WHERE r.status = 'expired'
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
    "due-without-live-lease": """
        SELECT r.id, 'due for ' || date_trunc('second', now() - r.hold_until)::text
                     || ', lease ' || coalesce('lapsed ' || l.lease_until::text, 'never taken')
          FROM reservations r LEFT JOIN publish_leases l ON l.reservation_id = r.id
         WHERE r.status = 'held' AND r.hold_until <= now() - make_interval(secs => $2)
           AND (l.lease_until IS NULL OR l.lease_until <= now())
           AND NOT EXISTS (SELECT 1 FROM parked_holds p WHERE p.reservation_id = r.id)
         LIMIT $1
    """,
}


# Whole-table checks: hash and merge joins (a nested loop over a table without
# statistics yet can take minutes), and more time than a single update gets.
VERIFY_SESSION = "SET LOCAL enable_nestloop = off; SET LOCAL statement_timeout = '10min'"


async def prepare_verification(conn: Connection) -> None:
    """Session settings for the verification queries (inside their transaction)."""
    await conn.execute(VERIFY_SESSION)


async def verify_totals(conn: Connection) -> dict[str, int]:
    """Reservations by status and the number of audited transitions."""
    row = await conn.fetchrow(VERIFY_TOTALS)
    return dict(row) if row else {}


async def verify_check(
    conn: Connection, name: str, *, limit: int, scan_interval: float
) -> list[tuple[UUID, str]]:
    """The violations of one named check (at most ``limit``)."""
    sql = VERIFY_CHECKS[name]
    args: tuple[object, ...] = (limit, scan_interval) if "$2" in sql else (limit,)
    return [(row[0], row[1]) for row in await conn.fetch(sql, *args)]
