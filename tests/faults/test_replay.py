"""Scenario 10: dead letters replayed twice at once, and a replay SIGKILLed between its
confirmed republish and the removal of the dead letter: one transition each."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import asyncpg
import pytest

from tests.faults.checks import queue_depths, settle, wait_for_consumers
from tests.faults.netproxy import AmqpAckTrap
from tests.faults.report import check_run
from tests.faults.scenario import Finished, stop_cleanly
from tests.faults.services import ServiceProcess
from tests.faults.workload import Workload, create_workload
from tests.faults.world import World
from tests.proxy import tcp_proxy

pytestmark = pytest.mark.faults

DEAD_LETTERS = 10
OPERATOR = "fault-suite"


async def dead_queue_depth(world: World) -> int:
    """Ready messages in expirations.dead."""
    depths = await queue_depths(world.amqp_url, ["expirations.dead"])
    return -1 if depths is None else depths["expirations.dead"]


async def _fetch(url: str, query: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetch(query)
    finally:
        await conn.close()


async def make_dead_letters(world: World, count: int) -> Workload:
    """``count`` due holds whose commands exhausted their attempts while the database was
    cut: in expirations.dead, the holds still held."""
    workload = await create_workload(world.database_url, count, future=1)
    async with tcp_proxy(world.database_url, 5432) as db_proxy:
        failing = await world.consumer(
            "failing", DATABASE_URL=db_proxy.url(world.database_url), EXPIRY_MAX_ATTEMPTS="2"
        )
        await wait_for_consumers(world.amqp_url, 1)
        db_proxy.cut()
        assert (await world.scan()).returncode == 0
        async with asyncio.timeout(60):
            while await dead_queue_depth(world) < count:
                await asyncio.sleep(0.2)
        await failing.stop(signal.SIGKILL)  # its recorder cannot reach the database
    return workload


async def wait_for_records(world: World, count: int) -> list[str]:
    """Wait until the recorder wrote ``count`` open dead-letter records; their message ids."""
    async with asyncio.timeout(60):
        while True:
            rows = await _fetch(
                world.database_url, "SELECT message_id FROM dead_letters WHERE status = 'dead'"
            )
            if len(rows) >= count:
                return sorted(str(row["message_id"]) for row in rows)
            await asyncio.sleep(0.2)


async def replay(world: World, *args: str, amqp_url: str | None = None) -> ServiceProcess:
    """Start ``python -m service.deadletters replay ... --operator``."""
    env = world.env(
        EXPIRY_WORKER_ID="replay",
        EXPIRY_REPLAY_OPERATORS=OPERATOR,
        **({"AMQP_URL": amqp_url} if amqp_url else {}),
    )
    return await world.fleet.start(
        "service.deadletters",
        "replay",
        *args,
        "--yes",
        "--operator",
        OPERATOR,
        name="replay",
        env=env,
    )


async def killed_between_republish_and_removal(world: World, message_id: str) -> ServiceProcess:
    """Replay one dead letter and SIGKILL the replay once its republish is confirmed,
    before its ack removes the dead letter."""
    process: ServiceProcess | None = None

    def kill() -> None:
        assert process is not None
        os.kill(process.pid, signal.SIGKILL)

    trap = AmqpAckTrap(fire=kill)
    async with tcp_proxy(world.amqp_url, world.node.amqp_port, trap) as proxy:
        process = await replay(world, message_id, amqp_url=proxy.url(world.amqp_url))
        code = await process.wait(60)
    assert trap.fired, process.text()[-2000:]
    assert code == -signal.SIGKILL, process.text()[-2000:]
    return process


async def test_replays_are_one_transition_each(world: World) -> None:
    """Replay SIGKILLed between republish and removal, then two replays of everything at
    once, then one more: every hold expires exactly once, the dead-letter queue ends empty."""
    workload = await make_dead_letters(world, DEAD_LETTERS)
    consumer = await world.consumer()
    message_ids = await wait_for_records(world, DEAD_LETTERS)
    started = time.monotonic()

    await killed_between_republish_and_removal(world, message_ids[0])
    async with asyncio.timeout(60):  # the republished copy expires the hold...
        while not [e for e in consumer.events() if e.get("outcome") == "expired"]:
            await asyncio.sleep(0.2)
    assert await dead_queue_depth(world) == DEAD_LETTERS  # ...and the dead letter is back

    twice = [await replay(world, "--all") for _ in range(2)]
    for process in twice:
        assert await process.wait(60) == 0, process.text()[-2000:]
    again = await replay(world, "--all")
    assert await again.wait(60) == 0, again.text()[-2000:]
    assert "0 selected" in again.text()

    expect = workload.expectation(set())
    settled = await settle(world, expect, 60)
    seconds = time.monotonic() - started
    await stop_cleanly([consumer])
    checked = await check_run(world, workload, Finished(expect, seconds, settled))
    audit = await _fetch(
        world.database_url, "SELECT outcome, count(*) AS n FROM dead_letter_replays GROUP BY 1"
    )
    checked.report(
        "10 replay",
        dead_lettered_first=DEAD_LETTERS,
        replay_audit="/".join(f"{row['outcome']}:{row['n']}" for row in audit),
        replays_killed=1,
    )
