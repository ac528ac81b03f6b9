"""Scenario 11: topology drift makes the service refuse to start, with one line.

The world's topology is declared by ``python -m service.declare``, as a deploy
does; the consumer and the scan only check it (passive declares, and the
arguments read from the node's management API). A queue re-declared otherwise
or missing stops each of them at once with one line, and the declare step too.
"""

from __future__ import annotations

import time

import aio_pika
import pytest

from tests.faults.report import report
from tests.faults.services import LogStats, ServiceProcess
from tests.faults.world import World
from tests.proxy import TcpProxy, tcp_proxy

pytestmark = pytest.mark.faults

DRIFTED = "exists on the broker with other settings"
MISSING = "does not exist on the broker; declare the topology first: python -m service.declare"


async def _redeclare(amqp_url: str, queue: str, arguments: dict[str, object] | None) -> None:
    """Delete ``queue``; declare it again with ``arguments`` (None: leave it deleted)."""
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        await channel.queue_delete(queue)
        if arguments is not None:
            await channel.declare_queue(queue, durable=True, arguments=arguments)  # type: ignore[arg-type]
    finally:
        await connection.close()


async def _refuses(world: World, proxy: TcpProxy, module: str, line: str) -> float:
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
    assert lines[0].startswith(f"python -m {module}: failed: TopologyMismatch: {line}"), lines[0]
    assert "Traceback" not in process.text()
    assert len(proxy.links) - before == 1, "it reconnected instead of giving up"
    return seconds


async def test_topology_drift_refuses_to_start_with_one_line(world: World) -> None:
    """A queue re-declared with other arguments, or missing: consume and scan exit 1 at
    once with one line (drift found through the management API), and so does the
    declare step on drift; once fixed, the declare step restores the topology."""
    work, tier = "expirations", world.retry_queues[1]
    await _redeclare(world.amqp_url, work, {"x-queue-type": "quorum", "x-delivery-limit": 5})
    async with tcp_proxy(world.amqp_url, world.node.amqp_port) as proxy:
        drifted = f"queue {work!r} {DRIFTED} ("
        consume_seconds = await _refuses(world, proxy, "service.consume", drifted)
        scan_seconds = await _refuses(world, proxy, "service.produce", drifted)
        declare_seconds = await _refuses(world, proxy, "service.declare", drifted)
        await _redeclare(world.amqp_url, work, None)
        assert (await world.declare()).returncode == 0
        await _redeclare(world.amqp_url, tier, {"x-queue-type": "quorum", "x-message-ttl": 999})
        tier_seconds = await _refuses(world, proxy, "service.consume", f"queue {tier!r} {DRIFTED}")
        await _redeclare(world.amqp_url, tier, None)
        missing_seconds = await _refuses(
            world, proxy, "service.consume", f"queue {tier!r} {MISSING}"
        )
        assert (await world.declare()).returncode == 0
    report(
        "11 topology drift",
        holds=0,
        seconds=consume_seconds + scan_seconds + declare_seconds + tier_seconds + missing_seconds,
        stats=LogStats([]),
        dead_letters=0,
        consume_exit_s=f"{consume_seconds:.1f}",
        scan_exit_s=f"{scan_seconds:.1f}",
        declare_exit_s=f"{declare_seconds:.1f}",
        tier_drift_exit_s=f"{tier_seconds:.1f}",
        missing_exit_s=f"{missing_seconds:.1f}",
        connections_per_attempt=1,
    )
