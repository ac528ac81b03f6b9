"""The batched guarded update keeps every guarantee of the per-message path."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from uuid import UUID

import asyncpg
import pytest

from service.adapters import postgres
from service.core.domain import Expiry, Outcome, command_body
from service.core.errors import UnknownReservation
from service.worker.batcher import Batcher, BatchFallback
from service.worker.delivery import Attempt
from service.worker.ports import PostgresStore
from tests import support
from tests.recipes import consumer_beside_a_transaction

pytestmark = pytest.mark.integration


@pytest.fixture
async def batcher(stack: support.Stack) -> AsyncIterator[Batcher]:
    """A batcher on the test's database: one worker, so each gathering is one batch."""
    pool = await postgres.create_pool(stack.settings, application_name="test-batch", size=4)
    store = PostgresStore(pool, stack.settings)
    batcher = Batcher(store, size=50, wait_ms=50, workers=1)
    try:
        yield batcher
    finally:
        await batcher.close()
        await pool.close()


async def _submit_all(batcher: Batcher, ids: list[UUID]) -> list[Expiry | BaseException]:
    return await asyncio.gather(
        *(batcher.submit(rid, f"m-{i}", 1) for i, rid in enumerate(ids)), return_exceptions=True
    )


async def test_duplicates_in_one_batch_make_one_transition(
    stack: support.Stack, batcher: Batcher
) -> None:
    """The same command three times in one batch: expired once, then already-done twice."""
    ids = await support.insert_holds(stack.database_url, 5)
    results = await _submit_all(batcher, [ids[0], *ids, ids[0], ids[0]])
    outcomes = [r.outcome for r in results if isinstance(r, Expiry)]
    done = Outcome.ALREADY_DONE
    assert outcomes == [Outcome.EXPIRED, done] + [Outcome.EXPIRED] * 4 + [done, done]
    assert isinstance(results[0], Expiry)
    assert results[0].lag_seconds is not None
    transitions = await support.transitions_per_reservation(stack.database_url)
    assert transitions == dict.fromkeys(ids, 1)


async def test_consumed_and_future_holds_in_a_batch_of_due_ones(
    stack: support.Stack, batcher: Batcher
) -> None:
    """Consumed and not-yet-due holds are not-eligible; their due neighbours expire."""
    due = await support.insert_holds(stack.database_url, 4)
    future = await support.insert_holds(stack.database_url, 2, due_in=3600)
    async with support.pg_connection(stack.database_url) as conn:
        await conn.execute("UPDATE reservations SET status = 'consumed' WHERE id = $1", due[0])
    results = await _submit_all(batcher, [*due, *future])
    outcomes = [r.outcome for r in results if isinstance(r, Expiry)]
    assert outcomes == [Outcome.NOT_ELIGIBLE] + [Outcome.EXPIRED] * 3 + [Outcome.NOT_ELIGIBLE] * 2
    assert await support.statuses(stack.database_url) == {"consumed": 1, "expired": 3, "held": 2}


async def test_unknown_reservation_fails_only_its_own_delivery(
    stack: support.Stack, batcher: Batcher
) -> None:
    """A command for a reservation that does not exist is unknown; the rest of the batch expires."""
    ids = await support.insert_holds(stack.database_url, 3)
    results = await _submit_all(batcher, [ids[0], uuid.uuid4(), ids[1], ids[2]])
    assert isinstance(results[1], UnknownReservation)
    assert [r.outcome for r in results if isinstance(r, Expiry)] == [Outcome.EXPIRED] * 3


async def test_a_failing_batch_falls_back_to_one_transaction_each(
    stack: support.Stack, batcher: Batcher
) -> None:
    """A batch PostgreSQL refuses as a whole (one value out of its column's range) changes
    nothing, and every delivery in it goes on alone."""
    ids = await support.insert_holds(stack.database_url, 4)
    results = await asyncio.gather(
        *(batcher.submit(rid, f"m-{i}", 2**40 if i == 2 else 1) for i, rid in enumerate(ids)),
        return_exceptions=True,
    )
    assert all(isinstance(r, BatchFallback) for r in results), results
    assert await support.transitions_per_reservation(stack.database_url) == {}


@pytest.mark.parametrize("size", [1, 4])
async def test_a_locked_row_is_skipped_not_waited_for(stack: support.Stack, size: int) -> None:
    """A row another transaction holds, however long: its batch does not wait for it
    (the lock and statement timeouts are a minute here); its neighbours expire, and it
    alone goes on to the one-at-a-time path (BatchFallback)."""
    settings = stack.settings.model_copy(
        update={"lock_timeout_ms": 60_000, "statement_timeout_ms": 60_000}
    )
    pool = await postgres.create_pool(settings, application_name="test-batch", size=2)
    batcher = Batcher(PostgresStore(pool, settings), size=50, wait_ms=50, workers=1)
    ids = await support.insert_holds(stack.database_url, size)
    try:
        async with support.pg_connection(stack.database_url) as holder:
            tx = holder.transaction()
            await tx.start()
            await holder.execute("SELECT 1 FROM reservations WHERE id = $1 FOR UPDATE", ids[-1])
            async with asyncio.timeout(30):  # half the lock timeout: it never waited
                results = await _submit_all(batcher, ids)
            await holder.execute(
                "UPDATE reservations SET status = 'consumed' WHERE id = $1", ids[-1]
            )
            await tx.commit()
    finally:
        await batcher.close()
        await pool.close()
    assert isinstance(results[-1], BatchFallback), results
    outcomes = [r.outcome for r in results[:-1] if isinstance(r, Expiry)]
    assert outcomes == [Outcome.EXPIRED] * (size - 1)
    expected = {"expired": size - 1, "consumed": 1}
    assert await support.statuses(stack.database_url) == {k: n for k, n in expected.items() if n}
    assert set(await support.transitions_per_reservation(stack.database_url)) == set(ids[:-1])


async def test_consumer_with_a_locked_row_in_its_batch(stack: support.Stack) -> None:
    """End to end: the neighbours of a locked row expire at once; it expires after a retry."""
    ids = await support.insert_holds(stack.database_url, 30)
    async with consumer_beside_a_transaction(stack, stack.settings) as (holder, tx, _):
        await holder.execute("SELECT 1 FROM reservations WHERE id = $1 FOR UPDATE", ids[7])
        rows = await holder.fetch("SELECT id, hold_until FROM reservations ORDER BY id")
        await support.publish_raw(
            stack.amqp_url, [command_body(r["id"], r["hold_until"]) for r in rows]
        )
        await support.eventually(lambda: _expired(stack, 29), timeout=30)
        await tx.rollback()
        await support.eventually(lambda: _expired(stack, 30), timeout=30)
    assert set((await support.transitions_per_reservation(stack.database_url)).values()) == {1}
    assert await support.queue_depth(stack.amqp_url, "expirations.dead") == 0


async def test_a_busy_row_is_waited_for_only_briefly(stack: support.Stack) -> None:
    """Alone after its batch skipped it, a delivery hardly waits for a row another
    transaction holds (the lock timeout is a minute here): LockNotAvailable, a transient
    error, retried later; once the row is free, it expires."""
    settings = stack.settings.model_copy(
        update={"lock_timeout_ms": 60_000, "statement_timeout_ms": 60_000}
    )
    pool = await postgres.create_pool(settings, application_name="test-batch", size=2)
    store = PostgresStore(pool, settings)
    [rid] = await support.insert_holds(stack.database_url, 1)
    try:
        async with support.pg_connection(stack.database_url) as holder:
            tx = holder.transaction()
            await tx.start()
            await holder.execute("SELECT 1 FROM reservations WHERE id = $1 FOR UPDATE", rid)
            with pytest.raises(asyncpg.LockNotAvailableError):
                async with asyncio.timeout(30):
                    await store.expire_one(rid, Attempt(1, 0, "m-1"), busy=True)
            await tx.rollback()
        expiry = await store.expire_one(rid, Attempt(2, 0, "m-1"), busy=True)
    finally:
        await pool.close()
    assert expiry.outcome is Outcome.EXPIRED


async def test_more_locked_rows_than_connections_leave_the_batches_theirs(
    stack: support.Stack,
) -> None:
    """Ten rows locked (for a minute, were they not released), a pool of four: the ten
    deliveries are tried alone on at most two connections and retried later; the
    batches keep their two connections, and every other hold expires while the locks
    are still held. Released, the ten end not eligible."""
    settings = stack.settings.model_copy(
        update={"db_pool_size": 4, "lock_timeout_ms": 60_000, "statement_timeout_ms": 60_000}
    )
    ids = await support.insert_holds(stack.database_url, 100)
    async with consumer_beside_a_transaction(stack, settings) as (holder, tx, _):
        await holder.execute("SELECT 1 FROM reservations WHERE id = ANY($1) FOR UPDATE", ids[:10])
        rows = await holder.fetch("SELECT id, hold_until FROM reservations ORDER BY id")
        await support.publish_raw(
            stack.amqp_url, [command_body(r["id"], r["hold_until"]) for r in rows]
        )
        await support.eventually(lambda: _expired(stack, 90), timeout=30)
        await holder.execute(
            "UPDATE reservations SET status = 'consumed' WHERE id = ANY($1)", ids[:10]
        )
        await tx.commit()
        for queue in ("expirations", "expirations.retry.1s", "expirations.retry.2s"):
            await support.eventually(lambda q=queue: _depth_is(stack, q, 0), timeout=30)  # type: ignore[misc]
    assert await support.statuses(stack.database_url) == {"expired": 90, "consumed": 10}
    assert set(await support.transitions_per_reservation(stack.database_url)) == set(ids[10:])
    assert await support.queue_depth(stack.amqp_url, "expirations.dead") == 0


async def _expired(stack: support.Stack, count: int) -> bool:
    return (await support.statuses(stack.database_url)).get("expired", 0) == count


@pytest.mark.parametrize("batch_size", [1, 100])
async def test_poison_and_duplicates_among_good_commands(
    stack: support.Stack, batch_size: int
) -> None:
    """Batch size 1 (the per-message path) and batched alike: poison dead, each hold once."""
    ids = await support.insert_holds(stack.database_url, 40)
    async with support.pg_connection(stack.database_url) as conn:
        rows = await conn.fetch("SELECT id, hold_until FROM reservations")
    bodies = [command_body(r["id"], r["hold_until"]) for r in rows]
    mixed = [*bodies[:20], b"{broken", *bodies, b"[]", *bodies[20:]]
    settings = stack.settings.model_copy(update={"batch_size": batch_size})
    async with support.attached_consumer(stack, settings):
        await support.publish_raw(stack.amqp_url, mixed)
        await support.eventually(lambda: _expired(stack, 40))
        await support.eventually(lambda: _depth_is(stack, "expirations", 0))
        await support.eventually(lambda: _depth_is(stack, "expirations.dead", 2))
    assert await support.transitions_per_reservation(stack.database_url) == dict.fromkeys(ids, 1)
    dead = await support.drain_queue(stack.amqp_url, "expirations.dead")
    assert sorted(m.body for m in dead) == [b"[]", b"{broken"]


async def _depth_is(stack: support.Stack, queue: str, depth: int) -> bool:
    return await support.queue_depth(stack.amqp_url, queue) == depth
