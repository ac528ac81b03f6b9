"""Faults during consumption: the database or the broker gone mid-stream."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from uuid import UUID

import aio_pika
import pytest

from service import scan
from service.core.domain import command_body, message_id
from service.core.topology import QUEUE
from service.declare import declare
from tests import support
from tests.proxy import tcp_proxy
from tests.recipes import (
    consumer_beside_a_transaction,
    consumer_cut_off,
    database_behind_proxy,
)

pytestmark = pytest.mark.integration


def _events(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.msg == event]


async def _all_expired(stack: support.Stack, count: int) -> bool:
    return (await support.statuses(stack.database_url)).get("expired", 0) == count


async def test_database_gone_mid_stream_retries_then_succeeds(
    stack: support.Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """PostgreSQL unreachable: commands go round the delay tiers, then all expire; none dead."""
    caplog.set_level(logging.INFO)
    await support.insert_holds(stack.database_url, 200)
    async with (
        database_behind_proxy(stack, max_attempts=20) as database,
        consumer_cut_off(stack, database),
    ):
        await support.eventually(lambda: _has_events(caplog, "expiry.retry", 200))
        # Round the delay tiers once more (a second attempt fails too) before it is back.
        await support.eventually(lambda: _retried_again(caplog))
        database.proxy.restore()
        await support.eventually(lambda: _all_expired(stack, 200), timeout=60)
    retried = _events(caplog, "expiry.retry")
    assert {r.error_class for r in retried} <= {"db.unavailable", "db.timeout"}  # type: ignore[attr-defined]
    assert max(r.attempt for r in retried) >= 2  # type: ignore[attr-defined]
    assert set((await support.transitions_per_reservation(stack.database_url)).values()) == {1}
    assert await support.queue_depth(stack.amqp_url, "expirations.dead") == 0
    assert not _events(caplog, "expiry.dead_letter")


async def _has_events(caplog: pytest.LogCaptureFixture, event: str, count: int) -> bool:
    return len(_events(caplog, event)) >= count


async def _retried_again(caplog: pytest.LogCaptureFixture) -> bool:
    return any(r.attempt >= 2 for r in _events(caplog, "expiry.retry"))  # type: ignore[attr-defined]


async def test_exhausted_retries_end_in_the_dead_letter_queue(stack: support.Stack) -> None:
    """When the attempt budget is spent, the command is dead-lettered with its history."""
    ids = await support.insert_holds(stack.database_url, 3)
    async with (
        database_behind_proxy(stack, max_attempts=3, retry_delays=(1,)) as database,
        consumer_cut_off(stack, database),
    ):
        await support.eventually(lambda: _depth_is(stack, "expirations.dead", 3), timeout=30)
    dead = await support.drain_queue(stack.amqp_url, "expirations.dead")
    # Each dead letter is the scan's own command for one of the holds: its id, its body.
    assert Counter((m.message_id, m.body) for m in dead) == await _commands_for(stack, ids)
    for message in dead:
        headers = message.headers
        assert headers["x-expiry-give-up"] == "attempts-exhausted"
        assert headers["x-expiry-attempt"] == 3
        assert headers["x-expiry-error-class"] == "db.unavailable"
        assert headers["x-expiry-worker"] == database.settings.worker_id
        first, last = headers["x-expiry-first-seen"], headers["x-expiry-last-seen"]
        assert isinstance(first, int)
        assert isinstance(last, int)
        assert first <= last
        assert "x-death" not in headers  # a fresh copy of ours, never a copied x-death
    assert await support.statuses(stack.database_url) == {"held": 3}


async def _commands_for(stack: support.Stack, ids: list[UUID]) -> Counter[tuple[str, bytes]]:
    """The message id and body the scan publishes for each of the holds ``ids``."""
    async with support.pg_connection(stack.database_url) as conn:
        rows = await conn.fetch(
            "SELECT id, hold_until FROM reservations WHERE id = ANY($1::uuid[])", ids
        )
    return Counter(
        (message_id(row["id"], row["hold_until"]), command_body(row["id"], row["hold_until"]))
        for row in rows
    )


async def _depth_is(stack: support.Stack, queue: str, depth: int) -> bool:
    return await support.queue_depth(stack.amqp_url, queue) == depth


async def test_refused_retry_publish_keeps_the_original(stack: support.Stack) -> None:
    """The retry tier refuses publishes while the database fails: nothing acked, nothing lost."""
    await stack.management.set_policy(
        stack.vhost,
        "refuse-retries",
        {
            "pattern": r"^expirations\.retry\.",
            "apply-to": "queues",
            "definition": {"max-length": 0, "overflow": "reject-publish"},
        },
    )
    await support.insert_holds(stack.database_url, 5)
    async with database_behind_proxy(stack) as database:
        async with consumer_cut_off(stack, database):
            await asyncio.sleep(3)
        # The consumer has stopped: every command must be back in a queue, none dead.
        await support.eventually(lambda: _ready_total_is(stack, 5))
        assert await support.queue_depth(stack.amqp_url, "expirations.dead") == 0
        database.proxy.restore()
        async with support.running_consumer(database.settings):
            await support.eventually(lambda: _all_expired(stack, 5), timeout=60)
    assert set((await support.transitions_per_reservation(stack.database_url)).values()) == {1}


async def _closed_some(stack: support.Stack) -> bool:
    return await stack.management.close_connections(stack.vhost) > 0


async def _ready_total_is(stack: support.Stack, total: int) -> bool:
    work = await support.queue_depth(stack.amqp_url, "expirations")
    retry = await support.queue_depth(stack.amqp_url, "expirations.retry.1s")
    return work + retry == total


async def test_broker_connection_lost_mid_update(
    stack: support.Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """The broker drops the connection while an update waits on a lock.

    The in-flight delivery is abandoned (never acked on the new channel), the
    consumer comes back by itself, the redelivery settles it: one transition.
    """
    caplog.set_level(logging.DEBUG)  # the per-delivery expiry.outcome line
    [rid] = await support.insert_holds(stack.database_url, 1)
    settings = stack.settings.model_copy(
        update={"lock_timeout_ms": 30000, "statement_timeout_ms": 30000}
    )
    async with consumer_beside_a_transaction(stack, settings) as (holder, tx, task):
        hold_until = await holder.fetchval("SELECT hold_until FROM reservations WHERE id = $1", rid)
        # A table lock: the update waits (a batch skips a row lock instead of waiting).
        await holder.execute("LOCK TABLE reservations IN SHARE MODE")
        # (A scan would wait too, so the command is published directly.)
        await support.publish_raw(stack.amqp_url, [command_body(rid, hold_until)])
        await asyncio.sleep(0.5)  # the guarded update now waits on the row lock
        # The management API lists connections a few seconds late: retry until one closes.
        await support.eventually(lambda: _closed_some(stack), timeout=30, every=0.5)
        await asyncio.sleep(0.5)
        await support.wait_for_consumers(stack.amqp_url, 1, task)  # the consumer is back
        await tx.commit()
        await support.eventually(lambda: _all_expired(stack, 1))
        await support.eventually(lambda: _depth_is(stack, "expirations", 0))
        assert not task.done()
    assert await support.transitions_per_reservation(stack.database_url) == {rid: 1}
    assert await support.queue_depth(stack.amqp_url, "expirations.dead") == 0
    # The first delivery's task died with its channel: it never logged nor acked. Its
    # update may still have committed (in a batch): then the redelivery finds it done.
    # If it did, the batch logs that expiry itself (orphaned), and the redelivery finds
    # it already done: exactly one "expired" line either way.
    outcomes = [r.outcome for r in _events(caplog, "expiry.outcome")]  # type: ignore[attr-defined]
    assert outcomes.count("expired") == 1, outcomes
    assert set(outcomes) <= {"expired", "already-done"}, outcomes


async def test_consumer_moves_to_another_node_when_its_node_goes_away(
    stack: support.Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """AMQP_URL names two nodes (two proxies to one broker here): losing the first, the
    consumer reconnects through the second by itself and keeps expiring holds."""
    caplog.set_level(logging.INFO)
    async with tcp_proxy(stack.amqp_url, 5672) as first, tcp_proxy(stack.amqp_url, 5672) as second:
        settings = stack.settings.model_copy(
            update={"amqp_url": (first.url(stack.amqp_url), second.url(stack.amqp_url))}
        )
        async with support.attached_consumer(stack, settings) as task:
            assert (len(first.links), len(second.links)) == (1, 0)
            first.cut()  # the node dies, and stays dead
            await support.eventually(lambda: _true(len(second.links) >= 1), timeout=30)
            await support.wait_for_consumers(stack.amqp_url, 1, task)
            await support.insert_holds(stack.database_url, 20)
            await scan.scan_once(stack.settings)
            await support.eventually(lambda: _all_expired(stack, 20), timeout=30)
    assert [r for r in caplog.records if r.msg == "broker.next_node"]


async def _true(value: bool) -> bool:
    return value


async def test_the_broker_cancels_the_consumer_and_it_consumes_again_once_the_queue_is_back(
    stack: support.Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """The work queue deleted under the consumer (the broker cancels its consumer), then
    declared again by the deploy step: the consumer keeps trying, consumes again on its
    own and expires what comes; nothing else of it restarts."""
    caplog.set_level(logging.INFO)
    async with support.attached_consumer(stack) as task:
        connection = await aio_pika.connect(stack.amqp_url)
        try:
            await (await connection.channel()).queue_delete(QUEUE)
        finally:
            await connection.close()
        await support.eventually(lambda: _has_events(caplog, "broker.consumer_cancelled", 1))
        await support.eventually(
            lambda: _has_events(caplog, "broker.consume_failed", 1), timeout=30
        )
        await declare(stack.settings)
        await support.wait_for_consumers(stack.amqp_url, 1, task)
        await support.insert_holds(stack.database_url, 20)
        await scan.scan_once(stack.settings)
        await support.eventually(lambda: _all_expired(stack, 20), timeout=30)
        assert not task.done()
    assert _events(caplog, "broker.consuming_again")
