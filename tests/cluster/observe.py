"""What the test reads: the cluster through a node's management API (the service's own
client), the database directly.

The database check is independent of the service: a trigger that the test
installs counts every status change (and any delete) of ``reservations``
into ``cluster_transitions`` (``tests/faults/checks.py``'s, with its own
prefix), beside the service's own audit trail.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote
from uuid import UUID

import asyncpg

from service.adapters.amqp.management import Management, ManagementUnavailable
from service.adapters.postgres.databases import admin_sql
from tests.cluster.nodes import ClusterNode
from tests.faults.checks import transition_trigger

QUEUE = "expirations"
DEAD_QUEUE = "expirations.dead"


def management(node: ClusterNode) -> Management:
    """``node``'s management API, as guest."""
    return Management(node.management_url, timeout=10)


async def create_vhost(node: ClusterNode, vhost: str) -> None:
    """Create ``vhost`` and give guest every permission on it."""
    await management(node).create_vhost(vhost)


async def queue_view(node: ClusterNode, vhost: str, name: str) -> dict[str, Any]:
    """One queue of ``vhost``, as ``node`` reports it."""
    return await management(node).queue(vhost, name)


async def queue_views(node: ClusterNode, vhost: str) -> list[dict[str, Any]]:
    """Every queue of ``vhost``."""
    return await management(node).queues(vhost)


def leader(view: dict[str, Any]) -> str:
    """The node that leads a quorum queue (``leader``; ``node`` on older brokers)."""
    return str(view.get("leader") or view["node"])


async def connection_nodes(node: ClusterNode, vhost: str, prefix: str) -> dict[str, str]:
    """The node of every client connection to ``vhost`` whose name starts with ``prefix``."""
    path = f"/vhosts/{quote(vhost, safe='')}/connections"
    found = await management(node).request("GET", path, columns="client_properties,node")
    nodes: dict[str, str] = {}
    for connection in found:
        name = str(connection.get("client_properties", {}).get("connection_name", ""))
        if name.startswith(prefix):
            nodes[name] = str(connection["node"])
    return nodes


async def close_connections(node: ClusterNode, vhost: str, prefix: str) -> int:
    """Close (through the management API) every connection to ``vhost`` whose client
    named it ``prefix...``; return how many."""
    return await management(node).close_connections(vhost, named=prefix)


async def eventually(
    check: Callable[[], Awaitable[bool]], *, timeout: float, every: float = 0.25
) -> None:
    """Wait until ``check()`` is true (a management API error counts as false), at most
    ``timeout``."""
    async with asyncio.timeout(timeout):
        while True:
            with contextlib.suppress(ManagementUnavailable):
                if await check():
                    return
            await asyncio.sleep(every)


TRIGGER_SQL = transition_trigger("cluster")

# Due one second ago for the first, ``spread`` seconds from now for the last,
# evenly in between: the scan keeps publishing while the consumers work.
INSERT_SPREAD = """
INSERT INTO reservations (id, hold_until)
SELECT gen_random_uuid(), now() + make_interval(secs => -1 + $2 * g / $1::float8)
  FROM generate_series(1, $1) AS g
RETURNING id
"""

STATE_SQL = """
WITH audited AS (
    SELECT reservation_id, count(*) AS n FROM reservation_transitions GROUP BY 1
), changes AS (
    SELECT reservation_id, count(*) AS n,
           count(*) FILTER (WHERE from_status = 'held' AND to_status = 'expired') AS expirations
      FROM cluster_transitions GROUP BY 1
)
SELECT r.id, r.status, coalesce(a.n, 0) AS audited, coalesce(c.n, 0) AS changes,
       coalesce(c.expirations, 0) AS expirations
  FROM reservations r
  LEFT JOIN audited a ON a.reservation_id = r.id
  LEFT JOIN changes c ON c.reservation_id = r.id
"""


async def execute(url: str, statement: str) -> None:
    """Run one statement on its own connection."""
    await admin_sql(url, statement)


async def insert_spread_holds(url: str, count: int, spread: float) -> list[UUID]:
    """Insert ``count`` held reservations falling due over the next ``spread`` seconds."""
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(INSERT_SPREAD, count, spread)
    finally:
        await conn.close()
    return [row["id"] for row in rows]


async def fetch_value(url: str, query: str) -> int:
    """One integer from the database."""
    conn = await asyncpg.connect(url)
    try:
        value = await conn.fetchval(query)
    finally:
        await conn.close()
    return int(value or 0)


@contextlib.asynccontextmanager
async def reservations_locked(url: str) -> AsyncIterator[None]:
    """Hold a lock on the reservations table that every update waits for.

    Not row locks: a batch skips the rows another transaction holds (``SKIP
    LOCKED``) and tries them alone without waiting, so nothing would wait long.
    """
    conn = await asyncpg.connect(url)
    try:
        async with conn.transaction():
            await conn.execute("LOCK TABLE reservations IN SHARE MODE")
            yield
    finally:
        await conn.close()


async def consumers_waiting_on_locks(url: str) -> int:
    """Sessions of the consumers that wait for a lock right now."""
    return await fetch_value(
        url,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = 'expiry-consume' AND wait_event_type = 'Lock'",
    )


async def expired_count(url: str) -> int:
    """How many reservations are expired."""
    return await fetch_value(url, "SELECT count(*) FROM reservations WHERE status = 'expired'")


@dataclass(frozen=True)
class EndState:
    """Where every hold ended, by the service's audit trail and by the test's trigger."""

    statuses: dict[str, int]
    not_once_audited: list[UUID]  # not exactly one row in reservation_transitions
    not_once_expired: list[UUID]  # not exactly one held -> expired change, or other changes
    dead_letter_records: int
    republished: int  # holds whose command the broker confirmed more than once


async def end_state(url: str) -> EndState:
    """Read the end state of every reservation."""
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(STATE_SQL)
        records = await conn.fetchval("SELECT count(*) FROM dead_letters")
        republished = await conn.fetchval(
            "SELECT count(*) FROM publish_leases WHERE publish_count > 1"
        )
    finally:
        await conn.close()
    statuses: dict[str, int] = {}
    for row in rows:
        statuses[row["status"]] = statuses.get(row["status"], 0) + 1
    return EndState(
        statuses=statuses,
        not_once_audited=[row["id"] for row in rows if row["audited"] != 1],
        not_once_expired=[
            row["id"] for row in rows if (row["expirations"], row["changes"]) != (1, 1)
        ],
        dead_letter_records=int(records),
        republished=int(republished),
    )
