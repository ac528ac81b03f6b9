"""The pipeline against the real PostgreSQL and RabbitMQ: scan, consume, ugly sequences."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from uuid import UUID

import aio_pika
import pytest

from service import scan
from service.core.domain import command_body, message_id
from service.core.errors import PublishNotConfirmed, TopologyMismatch
from tests import support
from tests.recipes import consumer_beside_a_transaction

pytestmark = pytest.mark.integration


async def _commands_for(stack: support.Stack, ids: Sequence[UUID]) -> tuple[list[bytes], list[str]]:
    async with support.pg_connection(stack.database_url) as conn:
        rows = await conn.fetch(
            "SELECT id, hold_until FROM reservations WHERE id = ANY($1::uuid[])", ids
        )
    return (
        [command_body(r["id"], r["hold_until"]) for r in rows],
        [message_id(r["id"], r["hold_until"]) for r in rows],
    )


async def test_scan_publishes_due_holds_in_the_contract_format(stack: support.Stack) -> None:
    """Only due held reservations are published, persistent, JSON, with the stable id."""
    due = await support.insert_holds(stack.database_url, 30, due_in=-5)
    await support.insert_holds(stack.database_url, 10, due_in=3600)
    consumed = await support.insert_holds(stack.database_url, 5, due_in=-5)
    async with support.pg_connection(stack.database_url) as conn:
        await conn.execute(
            "UPDATE reservations SET status = 'consumed' WHERE id = ANY($1::uuid[])", consumed
        )

    result = await scan.scan_once(stack.settings)

    assert (result.published, result.failed) == (30, 0)
    messages = await support.drain_queue(stack.amqp_url, "expirations")
    assert len(messages) == 30
    async with support.pg_connection(stack.database_url) as conn:
        rows = await conn.fetch("SELECT id, hold_until FROM reservations")
    deadlines = {row["id"]: row["hold_until"] for row in rows}
    seen = set()
    for message in messages:
        body = json.loads(message.body)
        rid = next(r for r in due if str(r) == body["reservation_id"])
        assert datetime.fromisoformat(body["hold_until"]) == deadlines[rid]
        millis = round(deadlines[rid].timestamp() * 1000)
        assert message.message_id == f"expire:{rid}:{millis}"
        assert message.content_type == "application/json"
        assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
        seen.add(rid)
    assert seen == set(due)


async def test_scan_skips_live_leases_and_republishes_lapsed_ones(stack: support.Stack) -> None:
    """A second scan publishes nothing in flight; once the lease lapses, it publishes again."""
    ids = await support.insert_holds(stack.database_url, 20)
    assert (await scan.scan_once(stack.settings)).published == 20
    assert (await scan.scan_once(stack.settings)).published == 0
    async with support.pg_connection(stack.database_url) as conn:
        await conn.execute(
            "UPDATE publish_leases SET lease_until = now() - interval '1 second' "
            "WHERE reservation_id = ANY($1::uuid[])",
            ids[:5],
        )
        assert (await scan.scan_once(stack.settings)).published == 5
        counts = await conn.fetch("SELECT publish_count FROM publish_leases ORDER BY 1")
    assert Counter(r["publish_count"] for r in counts) == {1: 15, 2: 5}
    assert await support.queue_depth(stack.amqp_url, "expirations") == 25


async def test_pipeline_expires_each_due_hold_exactly_once(stack: support.Stack) -> None:
    """Scan then consume: due holds expire once, future and consumed ones are untouched."""
    due = await support.insert_holds(stack.database_url, 600)
    future = await support.insert_holds(stack.database_url, 50, due_in=3600)
    async with support.attached_consumer(stack):
        await scan.scan_once(stack.settings)
        await support.eventually(lambda: _expired_count_is(stack, len(due)))
    transitions = await support.transitions_per_reservation(stack.database_url)
    assert set(transitions) == set(due)
    assert set(transitions.values()) == {1}
    assert (await support.statuses(stack.database_url))["held"] == len(future)
    assert await support.queue_depth(stack.amqp_url, "expirations") == 0
    assert await support.queue_depth(stack.amqp_url, "expirations.dead") == 0


async def _expired_count_is(stack: support.Stack, count: int) -> bool:
    return (await support.statuses(stack.database_url)).get("expired", 0) == count


async def test_duplicates_to_two_consumers_make_one_transition(stack: support.Stack) -> None:
    """Every command delivered four times, to two consumers at once: one transition each."""
    ids = await support.insert_holds(stack.database_url, 100)
    bodies, mids = await _commands_for(stack, ids)
    async with (
        support.running_consumer(stack.settings.model_copy(update={"worker_id": "a"})) as a,
        support.running_consumer(stack.settings.model_copy(update={"worker_id": "b"})) as b,
    ):
        await support.wait_for_consumers(stack.amqp_url, 2, a)
        await asyncio.gather(
            *(support.publish_raw(stack.amqp_url, bodies, message_ids=mids) for _ in range(4))
        )
        await support.eventually(lambda: _expired_count_is(stack, 100))
        await support.eventually(lambda: _queue_empty(stack, "expirations"))
        assert not b.done()
    transitions = await support.transitions_per_reservation(stack.database_url)
    assert len(transitions) == 100
    assert set(transitions.values()) == {1}
    assert await support.queue_depth(stack.amqp_url, "expirations.dead") == 0


async def _queue_empty(stack: support.Stack, queue: str) -> bool:
    info = await stack.management.queue(stack.vhost, queue)
    return bool(info.get("messages", 1) == 0)


async def test_consumed_at_the_deadline_ends_in_one_terminal_state(stack: support.Stack) -> None:
    """Support side and consumer race on holds at their common deadline: never both.

    The support side consumes from one end as the deadline passes, the consumer
    expires from the other end; they meet in the middle, where each row sees
    both writers at once. A later round of commands finishes what is left.
    """
    consume_sql = "UPDATE reservations SET status = 'consumed' WHERE id = $1 AND status = 'held'"
    async with support.running_consumer(
        stack.settings.model_copy(update={"prefetch": 200})
    ) as task:
        await support.wait_for_consumers(stack.amqp_url, 1, task)
        # The deadline is set once the consumer is attached: its start, however slow,
        # cannot eat into the time the setup has before the deadline.
        async with support.pg_connection(stack.database_url) as conn:
            deadline = await conn.fetchval("SELECT now() + interval '2 seconds'")
            ids = [
                row["id"]
                for row in await conn.fetch(
                    "INSERT INTO reservations (id, hold_until) "
                    "SELECT gen_random_uuid(), $1 FROM generate_series(1, 400) RETURNING id",
                    deadline,
                )
            ]
        bodies, mids = await _commands_for(stack, ids)
        order = {str(rid): i for i, rid in enumerate(ids)}
        pairs = sorted(
            zip(bodies, mids, strict=True),
            key=lambda p: -order[json.loads(p[0])["reservation_id"]],
        )

        async def at(offset: float) -> None:
            await asyncio.sleep(max(0.0, deadline.timestamp() + offset - time.time()))

        async def support_side() -> None:
            async with support.pg_connection(stack.database_url) as conn:
                await at(0.0)
                for rid in ids:
                    await conn.execute(consume_sql, rid)

        async def commands(offset: float) -> None:
            await at(offset)
            await support.publish_raw(
                stack.amqp_url, [p[0] for p in pairs], message_ids=[p[1] for p in pairs]
            )

        assert time.time() < deadline.timestamp() - 0.3, "setup took longer than the deadline"
        await asyncio.gather(support_side(), commands(-0.05), commands(1.0))
        await support.eventually(lambda: _queue_empty(stack, "expirations"))
    async with support.pg_connection(stack.database_url) as conn:
        rows = await conn.fetch(
            "SELECT r.status, count(t.id) AS n FROM reservations r "
            "LEFT JOIN reservation_transitions t ON t.reservation_id = r.id GROUP BY r.id, r.status"
        )
    by_state = Counter((row["status"], row["n"]) for row in rows)
    print("terminal states at the deadline:", dict(by_state))
    assert set(by_state) <= {("expired", 1), ("consumed", 0)}, by_state
    assert sum(by_state.values()) == 400


async def test_consumer_waits_for_a_support_side_lock_and_respects_its_outcome(
    stack: support.Stack,
) -> None:
    """A consume that holds the row lock at the deadline wins; the command is a no-op."""
    [rid] = await support.insert_holds(stack.database_url, 1, due_in=-1)
    bodies, mids = await _commands_for(stack, [rid])
    async with consumer_beside_a_transaction(stack, stack.settings) as (holder, tx, _):
        await holder.execute("UPDATE reservations SET status = 'consumed' WHERE id = $1", rid)
        await support.publish_raw(stack.amqp_url, bodies, message_ids=mids)
        await asyncio.sleep(0.5)  # the guarded update is now waiting on the row lock
        await tx.commit()
        await support.eventually(lambda: _queue_empty(stack, "expirations"))
    assert await support.statuses(stack.database_url) == {"consumed": 1}
    assert await support.transitions_per_reservation(stack.database_url) == {}


POISON = [
    b"",
    b"not json at all",
    b"\x00\xff\xfe binary",
    b"[]",
    b'{"reservation_id": "nope", "hold_until": "2026-01-01T00:00:00Z"}',
    b'{"reservation_id": "6f1c2a8e-1d2b-4c3a-9e8f-0a1b2c3d4e5f"}',
    b'{"reservation_id": "6f1c2a8e-1d2b-4c3a-9e8f-0a1b2c3d4e5f", '
    b'"hold_until": "2026-01-01T00:00:00Z"}',
    b"{" * 10_000,
]
EXPECTED_CLASSES = [
    "poison.not-json",
    "poison.not-json",
    "poison.not-json",
    "poison.not-json",
    "poison.bad-uuid",
    "poison.schema",
    "unknown-reservation",
    "poison.not-json",
]


async def test_poison_bodies_are_dead_lettered_with_a_reason_and_the_consumer_goes_on(
    stack: support.Stack,
) -> None:
    """Any body at all: dead-lettered at once with its class; valid work still completes."""
    [rid] = await support.insert_holds(stack.database_url, 1)
    bodies, mids = await _commands_for(stack, [rid])
    async with support.attached_consumer(stack) as task:
        await support.publish_raw(
            stack.amqp_url, POISON, message_ids=[f"poison-{i}" for i in range(len(POISON))]
        )
        await support.publish_raw(stack.amqp_url, bodies, message_ids=mids)
        await support.eventually(lambda: _expired_count_is(stack, 1))
        await support.eventually(lambda: _depth_is(stack, "expirations.dead", len(POISON)))
        assert not task.done()
    dead = {m.message_id: m for m in await support.drain_queue(stack.amqp_url, "expirations.dead")}
    for index, error_class in enumerate(EXPECTED_CLASSES):
        headers = dead[f"poison-{index}"].headers
        assert headers["x-expiry-error-class"] == error_class
        assert headers["x-expiry-give-up"] == "permanent"
        assert headers["x-expiry-attempt"] == 1
        assert dead[f"poison-{index}"].body == POISON[index]


async def _depth_is(stack: support.Stack, queue: str, depth: int) -> bool:
    return await support.queue_depth(stack.amqp_url, queue) == depth


async def test_topology_drift_is_refused_with_one_clear_line(stack: support.Stack) -> None:
    """A work queue re-declared as a classic queue stops the service at start."""
    connection = await aio_pika.connect(stack.amqp_url)
    async with connection:
        channel = await connection.channel()
        await channel.queue_delete("expirations")
        await channel.declare_queue("expirations", durable=True)
    with pytest.raises(TopologyMismatch, match="queue 'expirations' exists on the broker"):
        await scan.scan_once(stack.settings)
    with pytest.raises(TopologyMismatch, match="queue 'expirations'"):
        async with support.running_consumer(stack.settings) as task:
            await task


async def test_scan_with_the_broker_down_records_nothing(stack: support.Stack) -> None:
    """No broker: the scan fails before claiming anything, so no lease is recorded."""
    await support.insert_holds(stack.database_url, 10)
    down = stack.settings.model_copy(update={"amqp_url": ("amqp://guest:guest@127.0.0.1:1/",)})
    with pytest.raises(ConnectionError):
        await scan.scan_once(down)
    async with support.pg_connection(stack.database_url) as conn:
        assert await conn.fetchval("SELECT count(*) FROM publish_leases") == 0


async def test_two_scans_at_once_split_the_work(stack: support.Stack) -> None:
    """Overlapping scans both succeed; every due hold is published, with few duplicates."""
    await support.insert_holds(stack.database_url, 3000)
    settings = stack.settings.model_copy(update={"scan_batch_size": 200})
    first, second = await asyncio.gather(scan.scan_once(settings), scan.scan_once(settings))
    total = first.published + second.published
    assert total >= 3000
    assert total - 3000 <= 2 * settings.scan_batch_size, (first, second)
    messages = await support.drain_queue(stack.amqp_url, "expirations")
    assert len({m.message_id for m in messages}) == 3000
    async with support.pg_connection(stack.database_url) as conn:
        assert await conn.fetchval("SELECT count(*) FROM publish_leases") == 3000


SCANNER_PIDS_SQL = """
SELECT pid FROM pg_stat_activity
 WHERE datname = current_database() AND application_name = 'expiry-produce'
"""


async def _scanner_pids(stack: support.Stack) -> list[int]:
    async with support.pg_connection(stack.database_url) as conn:
        return [row["pid"] for row in await conn.fetch(SCANNER_PIDS_SQL)]


async def test_a_scanner_keeps_its_connections_between_passes_and_replaces_lost_ones(
    stack: support.Stack,
) -> None:
    """Passes given the same ``Links`` (as ``--every`` does) share one database session; a
    terminated one is replaced at the next pass; after the broker closed the connection the
    next pass still publishes (reconnected or replaced); ``close`` leaves no session."""
    if stack.settings.db_pooler == "transaction":
        pytest.skip("behind a pooler the server sessions this test counts are the pooler's")
    links = scan.Links()
    try:
        await support.insert_holds(stack.database_url, 5)
        assert (await scan.scan_once(stack.settings, links=links)).published == 5
        [pid] = await _scanner_pids(stack)
        await support.insert_holds(stack.database_url, 5)
        assert (await scan.scan_once(stack.settings, links=links)).published == 5
        assert await _scanner_pids(stack) == [pid]  # the same session: kept
        async with support.pg_connection(stack.database_url) as conn:
            await conn.execute("SELECT pg_terminate_backend($1)", pid)
        await support.insert_holds(stack.database_url, 5)
        await support.eventually(lambda: _scanner_pids_are(stack, []))
        assert (await scan.scan_once(stack.settings, links=links)).published == 5
        [again] = await _scanner_pids(stack)
        assert again != pid
        await support.eventually(lambda: _closed_scanner_connection(stack))  # once the API lists it
        await support.insert_holds(stack.database_url, 5)
        assert (await scan.scan_once(stack.settings, links=links)).published == 5
    finally:
        await links.close()
    assert await _scanner_pids(stack) == []
    assert (
        len({m.message_id for m in await support.drain_queue(stack.amqp_url, "expirations")}) == 20
    )


async def _closed_scanner_connection(stack: support.Stack) -> bool:
    return await stack.management.close_connections(stack.vhost, named="expiry-produce") == 1


async def _scanner_pids_are(stack: support.Stack, pids: list[int]) -> bool:
    return await _scanner_pids(stack) == pids


async def test_due_is_decided_by_the_database_clock(stack: support.Stack) -> None:
    """A hold due in two seconds by the database's clock is published only after that."""
    links = scan.Links()
    try:
        # Connected and checked before the holds go in, so that the pass right after them
        # reads the database's clock within milliseconds, however slow connecting is.
        assert (await scan.scan_once(stack.settings, links=links)).published == 0
        await support.insert_holds(stack.database_url, 5, due_in=2.0)
        assert (await scan.scan_once(stack.settings, links=links)).published == 0
        await asyncio.sleep(2.2)
        assert (await scan.scan_once(stack.settings, links=links)).published == 5
    finally:
        await links.close()


async def test_unconfirmed_publishes_leave_no_lease_and_are_published_again(
    stack: support.Stack,
) -> None:
    """The broker refuses the work queue's publishes: the scan fails, its claims lapse at once,
    and the next scan publishes the same message ids."""
    await support.insert_holds(stack.database_url, 5)
    await scan.scan_once(stack.settings)  # declares, and leaves the queue over the limit below
    async with support.pg_connection(stack.database_url) as conn:
        await conn.execute("UPDATE publish_leases SET lease_until = now()")
    await stack.management.set_policy(
        stack.vhost,
        "refuse-work",
        {
            "pattern": "^expirations$",
            "apply-to": "queues",
            "definition": {"max-length": 0, "overflow": "reject-publish"},
        },
    )
    await support.eventually(lambda: _refuses(stack))
    with pytest.raises(PublishNotConfirmed):
        await scan.scan_once(stack.settings)
    async with support.pg_connection(stack.database_url) as conn:
        live = await conn.fetchval("SELECT count(*) FROM publish_leases WHERE lease_until > now()")
    assert live == 0
    await stack.management.delete_policy(stack.vhost, "refuse-work")
    await support.drain_queue(stack.amqp_url, "expirations")
    async with support.pg_connection(stack.database_url) as conn:
        await conn.execute("UPDATE publish_leases SET lease_until = now()")
    assert (await scan.scan_once(stack.settings)).published == 5
    ids = {m.message_id for m in await support.drain_queue(stack.amqp_url, "expirations")}
    assert len(ids) == 5


async def _refuses(stack: support.Stack) -> bool:
    info = await stack.management.queue(stack.vhost, "expirations")
    return bool(info.get("effective_policy_definition", {}).get("max-length") == 0)
