"""The soak: the whole load (``FAULTS_HOLDS``) with random SIGKILLs and one broker restart."""

from __future__ import annotations

import asyncio
import os
import random
import time

import pytest

from tests.faults.checks import wait_for_consumers
from tests.faults.report import check_run
from tests.faults.scenario import LoadRun
from tests.faults.workload import create_workload, holds_from_environment
from tests.faults.world import World

pytestmark = pytest.mark.faults

OUTAGE_SECONDS = 2.0


def schedule(rng: random.Random, holds: int) -> list[tuple[float, str]]:
    """Random moments (shares of the due holds done): SIGKILLs, and one broker restart."""
    kills = [(rng.uniform(0.05, 0.9), "kill") for _ in range(max(5, holds // 4000))]
    return sorted([*kills, (rng.uniform(0.3, 0.6), "broker")])


async def restart_broker(run: LoadRun) -> float:
    """stop_app, a short outage, start_app; wait until every consumer is back; seconds."""
    node = run.world.node
    await wait_for_consumers(run.world.amqp_url, len(run.live), timeout=60)
    await asyncio.to_thread(node.stop_app)
    await asyncio.sleep(OUTAGE_SECONDS)
    await asyncio.to_thread(node.start_app)
    started = time.monotonic()
    await wait_for_consumers(run.world.amqp_url, len(run.live), timeout=60)
    return time.monotonic() - started


async def test_soak_with_sigkills_and_a_broker_restart(world: World) -> None:
    """The full load with random SIGKILLs of consumers and one broker restart: zero lost,
    zero double transitions."""
    seed = int(os.environ.get("FAULTS_SEED") or random.randrange(1 << 30))
    rng = random.Random(seed)
    workload = await create_workload(world.database_url, holds_from_environment())
    run = LoadRun(world, workload, rng=rng)
    await run.start(consumers=3)
    back = 0.0
    for point, action in schedule(rng, len(workload.due)):
        await run.reach(point)
        if action == "kill":
            await run.kill_one()
        else:
            back = await restart_broker(run)
    end = await run.finish()
    checked = await check_run(world, workload, end)
    stats = checked.stats
    checked.report(
        "0 soak: SIGKILLs + broker restart",
        sigkills=run.kills,
        broker_restarts=1,
        consumers_back_s=f"{back:.1f}",
        redelivered=stats.redelivered,
        expired=checked.outcome.expired,
        consumed_by_support=len(end.expect.consumed),
        seed=seed,
    )
