"""Scenario 11: topology drift makes the service refuse to start, with one line."""

from __future__ import annotations

import time

import aio_pika
import pytest

from tests.faults.netproxy import FaultProxy, fault_proxy
from tests.faults.report import report
from tests.faults.services import LogStats, ServiceProcess
from tests.faults.world import World

pytestmark = pytest.mark.faults


async def _declare(amqp_url: str, queue: str, arguments: dict[str, object]) -> None:
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        await channel.declare_queue(queue, durable=True, arguments=arguments)  # type: ignore[arg-type]
    finally:
        await connection.close()


async def _delete(amqp_url: str, queue: str) -> None:
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        await channel.queue_delete(queue)
    finally:
        await connection.close()


async def _refuses(world: World, proxy: FaultProxy, module: str, queue: str) -> float:
    """Run ``module`` through ``proxy``; require one clear line, no loop; return seconds."""
    args = ["--scan"] if module == "service.produce" else []
    env = world.env(AMQP_URL=proxy.url(world.amqp_url), EXPIRY_WORKER_ID="drift")
    before, started = len(proxy.links), time.monotonic()
    process: ServiceProcess = await world.fleet.run(
        module, *args, name=module.rsplit(".", 1)[-1], env=env, timeout=60
    )
    seconds = time.monotonic() - started
    lines = process.plain_lines()
    assert process.returncode == 1, process.text()
    assert len(lines) == 1, process.text()
    assert lines[0].startswith(f"python -m {module}: failed: TopologyMismatch: queue {queue!r}")
    assert "Traceback" not in process.text()
    assert len(proxy.links) - before == 1, "it reconnected instead of giving up"
    return seconds


async def test_topology_drift_refuses_to_start_with_one_line(world: World) -> None:
    """A queue pre-declared with other arguments: consume and scan exit 1 at once, one line."""
    await _declare(
        world.amqp_url,
        "expirations",
        {"x-queue-type": "quorum", "x-delivery-limit": 5},
    )
    async with fault_proxy(world.amqp_url, world.node.amqp_port) as proxy:
        consume_seconds = await _refuses(world, proxy, "service.consume", "expirations")
        scan_seconds = await _refuses(world, proxy, "service.produce", "expirations")
        await _delete(world.amqp_url, "expirations")
        await _declare(
            world.amqp_url,
            world.retry_queues[1],
            {"x-queue-type": "quorum", "x-message-ttl": 999},
        )
        tier_seconds = await _refuses(world, proxy, "service.consume", world.retry_queues[1])
    report(
        "11 topology drift",
        holds=0,
        seconds=consume_seconds + scan_seconds + tier_seconds,
        stats=LogStats([]),
        dead_letters=0,
        consume_exit_s=f"{consume_seconds:.1f}",
        scan_exit_s=f"{scan_seconds:.1f}",
        tier_drift_exit_s=f"{tier_seconds:.1f}",
        connections_per_attempt=1,
    )
