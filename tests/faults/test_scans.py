"""Scenario 9: overlapping scans, a scan during a broker outage, a scan whose confirms are lost."""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter

import asyncpg
import pytest

from tests.faults.checks import queue_depths, settle, wait_for_consumers
from tests.faults.netproxy import AmqpPublishTrap
from tests.faults.report import check_run
from tests.faults.scenario import Finished, settle_timeout, stop_cleanly
from tests.faults.services import ServiceProcess
from tests.faults.workload import Workload, create_workload, holds_from_environment
from tests.faults.world import World
from tests.proxy import tcp_proxy

pytestmark = pytest.mark.faults

PUBLISHED = re.compile(r"^scan: published (\d+) command")


def published(scan: ServiceProcess) -> int:
    """How many commands a scan says it published (all confirmed)."""
    for line in scan.plain_lines():
        if match := PUBLISHED.match(line):
            return int(match.group(1))
    return 0


async def leases(url: str) -> tuple[int, int]:
    """(leases of confirmed commands, the highest publish count); a claim whose publish
    was never confirmed (publish count 0) is no lease."""
    conn = await asyncpg.connect(url)
    try:
        row = await conn.fetchrow(
            "SELECT count(*) FILTER (WHERE publish_count > 0) AS n,"
            " coalesce(max(publish_count), 0) AS top FROM publish_leases"
        )
    finally:
        await conn.close()
    assert row is not None
    return int(row["n"]), int(row["top"])


async def work_queue_depth(world: World) -> int:
    """Ready messages in the work queue (no consumer is attached)."""
    depths = await queue_depths(world.amqp_url, ["expirations"])
    assert depths is not None
    return depths["expirations"]


async def consume_all(world: World, workload: Workload, consumers: int = 2) -> Finished:
    """Attach consumers, let them finish, stop them; say how the run ended."""
    started = time.monotonic()
    processes = [await world.consumer() for _ in range(consumers)]
    await wait_for_consumers(world.amqp_url, consumers)
    expect = workload.expectation(set())
    settled = await settle(world, expect, settle_timeout(workload.holds))
    seconds = time.monotonic() - started
    await stop_cleanly(processes)
    return Finished(expect, seconds, settled)


async def test_overlapping_scans_split_the_work(world: World) -> None:
    """Three scans at once over the same due holds split the work (SKIP LOCKED and
    leases); each hold expires once."""
    workload = await create_workload(world.database_url, holds_from_environment())
    scans = await asyncio.gather(
        *(
            world.fleet.run(
                "service.produce", "--scan", name="scan", env=world.env(EXPIRY_SCAN_BATCH_SIZE="50")
            )
            for _ in range(3)
        )
    )
    assert [s.returncode for s in scans] == [0, 0, 0], [s.text()[-500:] for s in scans]
    total = sum(published(s) for s in scans)
    lease_rows, top = await leases(world.database_url)
    assert lease_rows == len(workload.due)
    assert total == await work_queue_depth(world) >= len(workload.due)
    checked = await check_run(world, workload, await consume_all(world, workload))
    checked.report(
        "9a overlapping scans",
        scans=len(scans),
        published=total,
        published_per_scan="/".join(str(published(s)) for s in scans),
        published_twice=total - len(workload.due),
        max_publish_count=top,
    )


def one_line_reason(process: ServiceProcess) -> str:
    """The single human line a failed command wrote (its JSON log lines aside)."""
    lines = process.plain_lines()
    assert len(lines) == 1, process.text()[-2000:]
    assert "Traceback" not in process.text()
    return lines[0]


async def test_scan_during_a_broker_outage(world: World) -> None:
    """A scan with the broker unreachable, and one that loses it mid-scan: exit 1 with one
    line, leases only for confirmed commands; the next scan finishes; one transition each."""
    workload = await create_workload(world.database_url, holds_from_environment())
    trap = AmqpPublishTrap()
    async with tcp_proxy(world.amqp_url, world.node.amqp_port, trap) as proxy:
        trap.proxy = proxy
        via_proxy = {"AMQP_URL": proxy.url(world.amqp_url), "EXPIRY_SCAN_BATCH_SIZE": "100"}
        proxy.cut()
        down = await world.scan(**via_proxy)
        assert down.returncode == 1
        assert "cannot reach RabbitMQ" in one_line_reason(down)
        assert await leases(world.database_url) == (0, 0)
        proxy.restore()
        trap.arm("cut", after=len(workload.due) // 2)
        cut = await world.scan(**via_proxy)
        assert cut.returncode == 1
        assert "failed:" in one_line_reason(cut)
        mid_scan_leases, _ = await leases(world.database_url)
        mid_scan_depth = await work_queue_depth(world)
        # Every lease stands for a confirmed command; a command may be in the queue
        # without a lease (its confirm was lost with the connection).
        assert 0 < mid_scan_leases <= mid_scan_depth < len(workload.due)
        proxy.restore()
        again = await world.scan(**via_proxy)
        assert again.returncode == 0, again.text()[-2000:]
    assert (await leases(world.database_url))[0] == len(workload.due)
    checked = await check_run(world, workload, await consume_all(world, workload))
    checked.report(
        "9b scan during broker outage",
        leases_after_outage=0,
        leases_after_mid_scan_cut=mid_scan_leases,
        queued_after_mid_scan_cut=mid_scan_depth,
        published_after=published(again),
    )


CONFIRM_LOST_HOLDS = 20


async def test_scan_whose_confirms_are_lost(world: World) -> None:
    """The broker takes the commands but its confirms never arrive: exit 1, no lease; the
    next scan publishes the same message ids again; one transition each."""
    workload = await create_workload(world.database_url, CONFIRM_LOST_HOLDS, future=5)
    trap = AmqpPublishTrap()
    async with tcp_proxy(world.amqp_url, world.node.amqp_port, trap) as proxy:
        trap.arm("hold", after=1)
        started = time.monotonic()
        lost = await world.scan(
            AMQP_URL=proxy.url(world.amqp_url),
            EXPIRY_PUBLISH_TIMEOUT_SECONDS="2",
            EXPIRY_HEARTBEAT_SECONDS="2",
        )
        lost_seconds = time.monotonic() - started
        assert lost.returncode == 1
        assert "not confirmed" in one_line_reason(lost)
    assert await leases(world.database_url) == (0, 0)
    assert await work_queue_depth(world) == CONFIRM_LOST_HOLDS  # the broker has them all
    again = await world.scan()
    assert again.returncode == 0, again.text()[-2000:]
    assert published(again) == CONFIRM_LOST_HOLDS
    assert await work_queue_depth(world) == 2 * CONFIRM_LOST_HOLDS
    checked = await check_run(world, workload, await consume_all(world, workload, consumers=1))
    stats = checked.stats
    ids = Counter(str(e["message_id"]) for e in stats.named("expiry.outcome"))
    assert set(ids.values()) == {2}, ids  # the same message id, twice each
    assert stats.outcomes == {"expired": CONFIRM_LOST_HOLDS, "already-done": CONFIRM_LOST_HOLDS}
    checked.report(
        "9c scan confirms lost",
        lost_scan_exit_s=f"{lost_seconds:.1f}",
        republished=published(again),
    )


async def test_overlapping_scans_publish_each_hold_once(world: World) -> None:
    """Four scans at once with small pages, a few rounds: no hold is published twice."""
    for _round in range(3):
        workload = await create_workload(world.database_url, 5000, future=0)
        scans = await asyncio.gather(
            *(
                world.fleet.run(
                    "service.produce",
                    "--scan",
                    name="scan",
                    env=world.env(EXPIRY_SCAN_BATCH_SIZE="20"),
                )
                for _ in range(4)
            )
        )
        assert [s.returncode for s in scans] == [0] * 4
        _rows, top = await leases(world.database_url)
        assert top == 1, f"a hold was published {top} times by overlapping scans"
        await _expire_directly(world, workload)


async def _expire_directly(world: World, workload: Workload) -> None:
    """Take a round's holds out of the next round's scans."""
    conn = await asyncpg.connect(world.database_url)
    try:
        await conn.execute(
            "UPDATE reservations SET status = 'expired' WHERE id = ANY($1::uuid[])",
            workload.due,
        )
    finally:
        await conn.close()
