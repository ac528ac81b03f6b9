"""Scenarios 5, 6 and 8: the database stopped, cut during a commit, locked, or failing
while the retry tier refuses publishes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections import Counter
from uuid import UUID

import asyncpg
import pytest

from tests.faults.checks import queue_depths, settle, wait_for_consumers
from tests.faults.netproxy import PgCommitCut
from tests.faults.report import check_run
from tests.faults.scenario import Finished, LoadRun, stop_cleanly
from tests.faults.services import ServiceProcess
from tests.faults.workload import create_workload, holds_from_environment
from tests.faults.world import World
from tests.proxy import tcp_proxy

pytestmark = pytest.mark.faults

DB_DOWN_SECONDS = 6.0
LOCKED_HOLDS = 20
REFUSED_HOLDS = 20


def without_tls(url: str) -> str:
    """``url`` with TLS off, so that a proxy can read the protocol."""
    return url + ("&" if "?" in url else "?") + "sslmode=disable"


async def test_database_stopped_mid_stream(pg_world: World) -> None:
    """The private PostgreSQL cluster stopped mid-stream: commands go round the delay tiers,
    none is dead-lettered within the budget, all expire once it is back."""
    world, cluster = pg_world, pg_world.cluster
    assert cluster is not None
    workload = await create_workload(world.database_url, holds_from_environment())
    run = LoadRun(world, workload)
    await run.start(consumers=3)
    await run.reach(0.3)
    # The consumers are frozen while the cluster stops: they drain 2,000 holds in well
    # under a second, and without this a stop that takes longer than their rest found
    # nothing left in the stream (CI saw it once). They wake to a database that is gone.
    for consumer in run.live:
        os.kill(consumer.pid, signal.SIGSTOP)
    try:
        left = 1.0 - (await run.progress() or 0.0)
        await asyncio.to_thread(cluster.stop)
    finally:
        for consumer in run.live:
            os.kill(consumer.pid, signal.SIGCONT)
    assert left > 0.1, f"only {left:.0%} of the work was left when the database stopped"
    await asyncio.sleep(DB_DOWN_SECONDS)
    await asyncio.to_thread(cluster.start)
    end = await run.finish()
    checked = await check_run(world, workload, end)
    stats = checked.stats
    retries = stats.named("expiry.retry")
    tiers = Counter(int(e["delay_s"]) for e in retries)
    assert len(tiers) >= 2, f"the retries did not go through the delay tiers: {tiers}"
    checked.report(
        "5a database stopped",
        down_s=DB_DOWN_SECONDS,
        retries_per_tier="/".join(f"{tier}s:{n}" for tier, n in sorted(tiers.items())),
        max_attempt=max(int(e["attempt"]) for e in retries),
        error_classes="/".join(
            sorted({str(e["error_class"]) for e in stats.named("expiry.retry")})
        ),
    )


async def _audit(url: str, reservation_ids: list[UUID]) -> dict[str, list[int]]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT reservation_id, attempt FROM reservation_transitions"
            " WHERE reservation_id = ANY($1::uuid[])",
            reservation_ids,
        )
    finally:
        await conn.close()
    audit: dict[str, list[int]] = {str(i): [] for i in reservation_ids}
    for row in rows:
        audit[str(row["reservation_id"])].append(row["attempt"])
    return audit


async def test_connection_cut_during_commit(world: World) -> None:
    """The connection cut as the guarded update commits: the consumer cannot know the
    outcome and acks nothing as done on that answer; whatever handles the command next
    finds it already done; one transition each."""
    workload = await create_workload(world.database_url, max(300, holds_from_environment() // 10))
    cutter = PgCommitCut()
    async with tcp_proxy(world.database_url, 5432, cutter) as proxy:
        run = LoadRun(world, workload)
        run.consumer_env["DATABASE_URL"] = without_tls(proxy.url(world.database_url))
        # Armed from the start: a whole prefetch window can finish in one batch.
        cutter.armed = True
        await run.start(consumers=1)
        async with asyncio.timeout(30):
            while cutter.fired is None or not cutter.fired.closed:
                await asyncio.sleep(0.05)
        end = await run.finish()
    checked = await check_run(world, workload, end)
    cut = [str(i) for i in cutter.reservation_ids]
    assert cut, "the cut statement named no reservation"
    # The commit happened: each audit row is the first attempt's, made by the cut statement...
    assert await _audit(world.database_url, cutter.reservation_ids) == {i: [1] for i in cut}
    stats = checked.stats
    # ...yet no delivery was settled on its lost answer: each was decided again, and found
    # already done (after a retry, or by the fallback of a failed batch).
    for reservation_id in cut:
        outcomes = [
            e["outcome"]
            for e in stats.for_reservation(reservation_id)
            if e.get("event") == "expiry.outcome"
        ]
        assert outcomes == ["already-done"], (reservation_id, outcomes)
    checked.report(
        "5b connection cut during commit",
        commits_cut=1,
        holds_in_cut_commit=len(cut),
        batch_failures=len(stats.named("expiry.batch_failed")),
    )


async def test_row_lock_held_longer_than_the_lock_timeout(world: World) -> None:
    """The support side holds row locks longer than the lock timeout while their commands
    arrive: those are retried, then succeed (or find the hold consumed)."""
    rng = random.Random(5)
    workload = await create_workload(world.database_url, max(300, holds_from_environment() // 10))
    locked = rng.sample(workload.due, LOCKED_HOLDS)
    consumed = locked[: LOCKED_HOLDS // 2]
    assert (await world.scan()).returncode == 0  # the commands wait in the queue
    run = LoadRun(world, workload, rng=rng)
    run.consumer_env["EXPIRY_LOCK_TIMEOUT_MS"] = "500"
    support = await asyncpg.connect(world.database_url)
    try:
        async with support.transaction():
            await support.execute(
                "SELECT 1 FROM reservations WHERE id = ANY($1::uuid[]) FOR UPDATE", locked
            )
            await run.start(consumers=2)
            async with asyncio.timeout(60):
                while len({e["reservation_id"] for e in _lock_timeouts(world)}) < LOCKED_HOLDS:
                    await asyncio.sleep(0.2)
            held_for = time.monotonic() - run.started
            await support.execute(
                "UPDATE reservations SET status = 'consumed', updated_at = now() "
                "WHERE id = ANY($1::uuid[]) AND status = 'held'",
                consumed,
            )
    finally:
        await support.close()
    end = await run.finish()
    end.expect.consumed.update(consumed)
    checked = await check_run(world, workload, end)
    stats = checked.stats
    assert {e["reservation_id"] for e in _lock_timeouts(world)} == {str(i) for i in locked}
    checked.report(
        "6 row lock past lock timeout",
        locked=LOCKED_HOLDS,
        lock_held_s=f"{held_for:.1f}",
        lock_timeouts=len(_lock_timeouts(world)),
        not_eligible=stats.outcomes["not-eligible"],
    )


def _lock_timeouts(world: World) -> list[dict[str, object]]:
    return [
        e
        for e in world.fleet.consumer_stats().named("expiry.retry")
        if e["error_class"] == "db.timeout"
    ]


async def test_refused_retry_tier_while_the_database_fails(world: World) -> None:
    """The delay tiers refuse publishes (max-length 0, reject-publish) while the database
    fails: a command whose retry copy is refused is not acked and not lost; all expire
    once both recover."""
    workload = await create_workload(world.database_url, REFUSED_HOLDS, future=2)
    queues = ["expirations", *world.retry_queues]
    async with tcp_proxy(world.database_url, 5432) as db_proxy:
        consumer = await world.consumer(DATABASE_URL=db_proxy.url(world.database_url))
        await wait_for_consumers(world.amqp_url, 1)
        await _refuse_retries(world)
        db_proxy.cut()
        started = time.monotonic()
        assert (await world.scan()).returncode == 0
        async with asyncio.timeout(30):
            while len(_handled(consumer)) < REFUSED_HOLDS:
                await asyncio.sleep(0.2)
        # SIGTERM now: what the consumer holds goes back, so the queues can be counted
        # exactly. Nothing was acked away: every command is in the work or a delay queue.
        assert await consumer.stop(timeout=60) == 0, consumer.text()[-2000:]
        kept = await _ready(world, queues, REFUSED_HOLDS)
        assert not _events(consumer, "expiry.outcome")
        fault_lasted = time.monotonic() - started
        await world.management.delete_policy(world.vhost, REFUSE)
    finisher = await world.consumer()
    expect = workload.expectation(set())
    settled = await settle(world, expect, 60)
    seconds = time.monotonic() - started
    await stop_cleanly([finisher])
    checked = await check_run(world, workload, Finished(expect, seconds, settled))
    refused = len(_events(consumer, "expiry.copy_failed"))
    assert refused > 0
    checked.report(
        "8 retry tier refuses publishes",
        copies_refused=refused,
        copies_accepted=len(_events(consumer, "expiry.retry")),
        kept_in_queues=kept,
        fault_s=f"{fault_lasted:.1f}",
    )


REFUSE = "refuse-retries"


async def _refuse_retries(world: World) -> None:
    """Apply the max-length 0 / reject-publish policy to every delay queue, and wait for it."""
    policy = {
        "pattern": r"^expirations\.retry\.",
        "apply-to": "queues",
        "definition": {"max-length": 0, "overflow": "reject-publish"},
    }
    await world.management.set_policy(world.vhost, REFUSE, policy)
    async with asyncio.timeout(30):
        for queue in world.retry_queues:
            while (await world.management.queue(world.vhost, queue)).get("policy") != REFUSE:
                await asyncio.sleep(0.2)


async def _ready(world: World, queues: list[str], expected: int) -> int:
    """Wait until ``queues`` hold ``expected`` ready messages (a message on its way from a
    delay queue back to the work queue is briefly in neither); return the count."""
    total = -1
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(10):
            while total != expected:
                depths = await queue_depths(world.amqp_url, queues)
                total = -1 if depths is None else sum(depths.values())
                await asyncio.sleep(0.1)
    assert total == expected, f"{total} messages in {queues}, expected {expected}"
    return total


def _events(consumer: ServiceProcess, name: str) -> list[dict[str, object]]:
    return [e for e in consumer.events() if e.get("event") == name]


def _handled(consumer: ServiceProcess) -> set[object]:
    """Reservations whose command failed at least once (copy refused or accepted)."""
    return {
        e["reservation_id"]
        for e in consumer.events()
        if e.get("event") in ("expiry.copy_failed", "expiry.retry")
    }
