"""Scenario 15: PostgreSQL fails over to its streaming replica mid-stream.

The service is given both hosts in one ``DATABASE_URL`` with
``target_session_attrs=read-write`` (asyncpg tries them in order and keeps the
one that accepts writes). Mid-stream the primary is stopped and, a moment
later, the replica promoted: the consumers and the scanner find the new
primary without a restart; what failed meanwhile goes through the retry tiers;
nothing is dead-lettered within the budget and nothing is lost.

Replication is asynchronous, as a default set-up is: a commit the old primary
acknowledged and the replica never received is lost with both of its rows (the
guarded update and its audit row are one transaction, so they never disagree).
The hold is then ``held`` again while its command was acked; its lease lapses
and the scan publishes it again. A short lease keeps that wait short here.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.faults.nodes import PgCluster
from tests.faults.report import check_run
from tests.faults.scenario import LoadRun
from tests.faults.workload import create_workload, holds_from_environment
from tests.faults.world import World

pytestmark = pytest.mark.faults

DOWN_SECONDS = 1.5  # no primary at all, before the replica is promoted
LEASE_SECONDS = 10


async def test_postgresql_fails_over_to_its_replica_mid_stream(
    failover_world: tuple[World, PgCluster, PgCluster],
) -> None:
    """Primary stopped at 30% done, the replica promoted 1.5 s later: the same processes
    go on against the new primary; every due hold expires once, no dead letter."""
    world, primary, replica = failover_world
    hosts = f"127.0.0.1:{primary.port},127.0.0.1:{replica.port}"
    world.database_url = (
        f"postgresql://postgres@{hosts}/{world.name}?target_session_attrs=read-write"
    )
    world.extra_env["EXPIRY_LEASE_SECONDS"] = str(LEASE_SECONDS)
    workload = await create_workload(world.database_url, holds_from_environment())
    run = LoadRun(world, workload)
    await run.start(consumers=3)
    before = list(run.consumers)
    await run.reach(0.3)
    stopped = time.monotonic()
    await asyncio.to_thread(primary.stop, "fast")
    await asyncio.sleep(DOWN_SECONDS)
    await asyncio.to_thread(replica.promote)
    promoted = time.monotonic()
    await run.reach(0.5)
    resumed = time.monotonic() - promoted
    assert run.consumers == before
    assert all(c.alive for c in before), "a consumer died instead of reconnecting"
    assert run.scanner is not None
    assert run.scanner.alive
    end = await run.finish()
    checked = await check_run(world, workload, end)
    assert not checked.outcome.dead_letters, "dead-lettered within the budget"
    checked.report(
        "15 PostgreSQL failover to a replica",
        primary_down_s=f"{promoted - stopped:.1f}",
        back_to_work_after_promote_s=f"{resumed:.1f}",
        consumer_restarts=0,
        scan_failures=len(run.scanner.named("scan.failed")),
    )
