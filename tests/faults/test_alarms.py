"""Scenario 13: the broker's disk and memory alarms.

With an alarm up, RabbitMQ blocks every connection that publishes and keeps
delivering to consumers. The scan must give up within its publish timeout,
exit non-zero and leave no lease for a command the broker did not confirm;
the consumers must keep draining what is queued (acks are not publishes);
once the alarm clears, a scan publishes the rest and everything completes.
The alarm is raised on the private node by lowering the free-disk limit above
the free space, or the memory watermark below what the node uses.
"""

from __future__ import annotations

import asyncio
import time
from uuid import UUID

import asyncpg
import pytest

from tests.faults.checks import queue_depths, settle, wait_for_consumers
from tests.faults.report import check_run
from tests.faults.scenario import Finished, settle_timeout, stop_cleanly
from tests.faults.test_scans import leases, one_line_reason, published
from tests.faults.workload import create_workload, holds_from_environment, insert_holds
from tests.faults.world import World

pytestmark = pytest.mark.faults

PUBLISH_TIMEOUT_SECONDS = 3
ALARMS = {
    # how to raise it, how to set the limit back (to the node's own, in bytes), the
    # field of GET /api/nodes that shows the alarm and the one that holds the limit
    "disk": (
        ("set_disk_free_limit", "100000GB"),
        ("set_disk_free_limit",),
        "disk_free_alarm",
        "disk_free_limit",
    ),
    "memory": (
        ("set_vm_memory_high_watermark", "0.000001"),
        ("set_vm_memory_high_watermark", "absolute"),
        "mem_alarm",
        "mem_limit",
    ),
}


async def alarm_is(world: World, field: str, up: bool) -> bool:
    """Whether the node's alarm ``field`` is as wanted (and shown at all)."""
    nodes = await world.management.request("GET", "/nodes")
    return all(field in node and bool(node[field]) is up for node in nodes)


async def wait_alarm(world: World, field: str, *, up: bool, timeout: float = 60) -> None:
    """Wait until the alarm is raised (``up``) or cleared."""
    async with asyncio.timeout(timeout):
        while not await alarm_is(world, field, up):
            await asyncio.sleep(0.2)


async def limit_of(world: World, field: str) -> int:
    """The node's limit ``field`` now, in bytes (a freshly booted node shows its limits
    only once it has collected its first statistics)."""
    async with asyncio.timeout(60):
        while True:
            [node] = await world.management.request("GET", "/nodes")
            if node.get(field) is not None:
                return int(node[field])
            await asyncio.sleep(0.5)


async def held_due(url: str, ids: list[UUID]) -> int:
    """How many of ``ids`` are still held."""
    conn = await asyncpg.connect(url)
    try:
        held: int = await conn.fetchval(
            "SELECT count(*) FROM reservations WHERE status = 'held' AND id = ANY($1::uuid[])",
            ids,
        )
    finally:
        await conn.close()
    return held


@pytest.mark.parametrize("alarm", sorted(ALARMS))
async def test_an_alarm_blocks_the_scan_and_the_consumers_keep_draining(
    world: World, alarm: str
) -> None:
    """Commands queued, then the alarm: consumers drain the queue; a scan of new due holds
    exits 1 within its publish timeout with no lease for what was not confirmed; the alarm
    cleared, a scan publishes the rest and every hold expires once."""
    raise_alarm, clear_alarm, field, limit_field = ALARMS[alarm]
    clear_alarm = (*clear_alarm, str(await limit_of(world, limit_field)))
    workload = await create_workload(world.database_url, holds_from_environment())
    first = await world.scan()
    assert first.returncode == 0, first.text()[-2000:]
    assert published(first) == len(workload.due)
    await asyncio.to_thread(world.node.ctl, *raise_alarm)
    try:
        await wait_alarm(world, field, up=True)
        later = await insert_holds(world.database_url, 200, due_in=-1.0)
        workload.due += later
        started = time.monotonic()
        consumers = [await world.consumer() for _ in range(2)]
        await wait_for_consumers(world.amqp_url, 2)
        timeout = {"EXPIRY_PUBLISH_TIMEOUT_SECONDS": str(PUBLISH_TIMEOUT_SECONDS)}
        scan_started = time.monotonic()
        blocked = await world.scan(60.0, **timeout)
        scan_seconds = time.monotonic() - scan_started
        assert blocked.returncode == 1, blocked.text()[-2000:]
        reason = one_line_reason(blocked)
        confirmed_leases, _ = await leases(world.database_url)
        assert confirmed_leases == len(workload.due) - len(later), "a lease without a confirm"
        async with asyncio.timeout(settle_timeout(workload.holds)):
            while (await queue_depths(world.amqp_url, ["expirations"]) or {}).get("expirations"):
                await asyncio.sleep(0.2)  # the consumers drain the queue under the alarm
        drained = time.monotonic() - started
        assert await held_due(world.database_url, later) == len(later)  # never published
    finally:
        await asyncio.to_thread(world.node.ctl, *clear_alarm)
    await wait_alarm(world, field, up=False)
    scanner = await world.scanner(every=1.0)
    expect = workload.expectation(set())
    settled = await settle(world, expect, settle_timeout(workload.holds))
    seconds = time.monotonic() - started
    await stop_cleanly([scanner, *consumers])
    checked = await check_run(world, workload, Finished(expect, seconds, settled))
    checked.report(
        f"13 broker {alarm} alarm",
        drained_under_alarm=len(workload.due) - len(later),
        drained_s=f"{drained:.1f}",
        scan_exit=blocked.returncode,
        scan_gave_up_s=f"{scan_seconds:.1f}",
        publish_timeout_s=PUBLISH_TIMEOUT_SECONDS,
        scan_reason=repr(reason[:80]),
    )
