"""Scenario 12: commands lost outside the broker's guarantees come back by their lease.

A confirmed command can still vanish: a queue purged by hand, a policy that
drops messages, a queue deleted and declared again. The scan gave the hold a
lease when the broker confirmed its command; while the hold stays held, the
lease lapses after ``EXPIRY_LEASE_SECONDS`` and the next scan publishes the
command again. The longest a user can wait, from the deadline: a scan interval
(the deadline falls just after a scan), the lease, another scan interval, then
the processing.
"""

from __future__ import annotations

import time

import asyncpg
import pytest

from tests.faults.checks import queue_depths, settle, wait_for_consumers
from tests.faults.report import check_run
from tests.faults.scenario import Finished, settle_timeout, stop_cleanly
from tests.faults.test_scans import published
from tests.faults.workload import create_workload, holds_from_environment
from tests.faults.world import World

pytestmark = pytest.mark.faults

LEASE_SECONDS = 4
SCAN_EVERY = 1.0

LAST_EXPIRY = "SELECT extract(epoch FROM max(at) - $1::timestamptz) FROM fault_transitions"
PUBLISH_COUNTS = """
SELECT publish_count, count(*) AS n FROM publish_leases
 WHERE reservation_id = ANY($1::uuid[]) GROUP BY 1 ORDER BY 1
"""


async def test_commands_lost_outside_the_broker_come_back_when_their_lease_lapses(
    world: World,
) -> None:
    """Every command of a scan is purged from the work queue before any consumer sees it:
    the scanner publishes each again once its lease lapses, and each hold expires once,
    within a scan interval plus the lease plus a scan interval (plus processing)."""
    workload = await create_workload(world.database_url, holds_from_environment())
    lease = {"EXPIRY_LEASE_SECONDS": str(LEASE_SECONDS)}
    scan = await world.scan(120.0, **lease)
    assert scan.returncode == 0, scan.text()[-2000:]
    assert published(scan) == len(workload.due)
    await world.management.request(
        "DELETE", f"/queues/{_name(world.vhost)}/expirations/contents"
    )  # lost: the broker had confirmed every one of them
    depths = await queue_depths(world.amqp_url, ["expirations"])
    assert depths == {"expirations": 0}
    conn = await asyncpg.connect(world.database_url)
    try:
        lost_at = await conn.fetchval("SELECT now()")
    finally:
        await conn.close()
    started = time.monotonic()
    consumers = [await world.consumer() for _ in range(2)]
    await wait_for_consumers(world.amqp_url, 2)
    scanner = await world.scanner(every=SCAN_EVERY, **lease)
    expect = workload.expectation(set())
    settled = await settle(world, expect, settle_timeout(workload.holds) + LEASE_SECONDS)
    seconds = time.monotonic() - started
    await stop_cleanly([scanner, *consumers])
    checked = await check_run(world, workload, Finished(expect, seconds, settled))
    conn = await asyncpg.connect(world.database_url)
    try:
        longest = float(await conn.fetchval(LAST_EXPIRY, lost_at))
        counts = {
            r["publish_count"]: r["n"] for r in await conn.fetch(PUBLISH_COUNTS, workload.due)
        }
    finally:
        await conn.close()
    assert counts == {2: len(workload.due)}, counts  # each published again, exactly once
    bound = LEASE_SECONDS + 2 * SCAN_EVERY
    checked.report(
        "12 commands lost outside the broker",
        lost=len(workload.due),
        published_again=counts.get(2, 0),
        lease_s=LEASE_SECONDS,
        last_expiry_after_loss_s=f"{longest:.1f}",
        bound_before_processing_s=f"{bound:.0f}",
    )


def _name(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")
