"""Scenarios 3 and 4: the broker stopped and started, or unreachable without a reset."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.faults.checks import wait_for_consumers
from tests.faults.report import check_run
from tests.faults.scenario import LoadRun
from tests.faults.workload import create_workload, holds_from_environment
from tests.faults.world import World
from tests.proxy import tcp_proxy

pytestmark = pytest.mark.faults

OUTAGE_SECONDS = 2.0
HEARTBEAT_SECONDS = 1
DB_LATENCY_SECONDS = 0.01


async def test_broker_stopped_and_started_mid_stream(world: World) -> None:
    """stop_app / start_app mid-stream: the same consumer processes recover, their consumer
    count comes back, stale acks are harmless, nothing is lost."""
    workload = await create_workload(world.database_url, holds_from_environment())
    async with tcp_proxy(world.database_url, 5432) as slow_db:
        slow_db.delay = DB_LATENCY_SECONDS  # so that every window is busy when the broker stops
        run = LoadRun(world, workload)
        run.consumer_env["DATABASE_URL"] = slow_db.url(world.database_url)
        await run.start(consumers=3)
        before = list(run.consumers)
        await run.reach(0.3)
        await asyncio.to_thread(world.node.stop_app)
        await asyncio.sleep(OUTAGE_SECONDS)
        await asyncio.to_thread(world.node.start_app)
        restarted = time.monotonic()
        await wait_for_consumers(world.amqp_url, len(before), timeout=60)
        recovered = time.monotonic() - restarted
        assert run.consumers == before
        assert all(c.alive for c in before), "a consumer died instead of reconnecting"
        end = await run.finish()
    checked = await check_run(world, workload, end)
    stats = checked.stats
    checked.report(
        "3 broker stop_app/start_app",
        consumers_back_s=f"{recovered:.1f}",
        stale_acks=len(stats.named("expiry.stale_delivery"))
        + len(stats.named("expiry.settle_failed")),
        redelivered=stats.redelivered,
        consumer_restarts=0,
    )


async def test_broker_blackholed_mid_stream(world: World) -> None:
    """The broker unreachable without a reset: heartbeats notice within seconds, the
    consumers reconnect once it is back, nothing is lost."""
    workload = await create_workload(world.database_url, holds_from_environment())
    async with tcp_proxy(world.amqp_url, world.node.amqp_port) as proxy:
        run = LoadRun(world, workload)
        run.consumer_env.update(
            AMQP_URL=proxy.url(world.amqp_url), EXPIRY_HEARTBEAT_SECONDS=str(HEARTBEAT_SECONDS)
        )
        await run.start(consumers=2)
        await run.reach(0.3)
        connections = [link for link in proxy.links if not link.closed]
        blackholed = time.monotonic()
        proxy.blackhole()
        async with asyncio.timeout(60):
            while any(link.client_closed_at is None for link in connections):
                await asyncio.sleep(0.1)
        noticed = max((link.client_closed_at or 0) - blackholed for link in connections)
        await asyncio.sleep(OUTAGE_SECONDS)
        proxy.restore()
        restored = time.monotonic()
        await wait_for_consumers(world.amqp_url, 2, timeout=90)
        reconnected = time.monotonic() - restored
        assert all(c.alive for c in run.consumers), "a consumer died instead of reconnecting"
        end = await run.finish()
    checked = await check_run(world, workload, end)
    # aiormq gives up after three heartbeat intervals (+1 s each) without a frame.
    assert noticed <= 3 * (HEARTBEAT_SECONDS + 1) + 3, noticed
    stats = checked.stats
    checked.report(
        "4 broker blackholed",
        heartbeat_s=HEARTBEAT_SECONDS,
        noticed_s=f"{noticed:.1f}",
        reconnected_s=f"{reconnected:.1f}",
        connections=len(proxy.links),
        redelivered=stats.redelivered,
    )
