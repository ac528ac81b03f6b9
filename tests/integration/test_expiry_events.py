"""The consumer's side of the outbox, through the real PostgreSQL and RabbitMQ: every
expiry writes exactly one event, in its own transaction, with its message id, its times
and its delivery's trace; nothing else writes one; and the relays are woken after the
commit, coalesced."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Any
from uuid import UUID

import aio_pika
import pytest

from service import scan
from service.adapters import postgres
from service.adapters.telemetry.tracing import recorder_for
from service.core.domain import Outcome, command_body, message_id
from service.core.events import event_message_id
from service.worker import wakeup
from service.worker.delivery import Attempt
from service.worker.ports import PostgresStore
from tests import support
from tests.outbox_rows import (
    events_by_reservation,
    expiries,
    listening,
    publish_each,
    traceparent,
)

pytestmark = pytest.mark.integration


async def _deadlines(url: str) -> dict[UUID, datetime]:
    async with support.pg_connection(url) as conn:
        rows = await conn.fetch("SELECT id, hold_until FROM reservations")
    return {row["id"]: row["hold_until"] for row in rows}


def _command(rid: UUID, hold_until: datetime, trace: str | None) -> tuple[bytes, str, Any]:
    headers = {} if trace is None else {"traceparent": trace}
    return command_body(rid, hold_until), message_id(rid, hold_until), headers


async def _assert_one_event_each(url: str, traces: dict[UUID, str | None]) -> None:
    """Each of these holds has exactly one event: its message id, its deadline, its
    transition's time, and the trace given; and no other hold has one."""
    deadlines, expired_at = await _deadlines(url), await expiries(url)
    events = await events_by_reservation(url)
    assert set(events) == set(traces)
    for rid, trace in traces.items():
        [event] = events[rid]
        assert event.message_id == event_message_id(rid, deadlines[rid])
        assert (event.hold_until, event.expired_at) == (deadlines[rid], expired_at[rid])
        assert event.traceparent == trace
        assert not event.sent


async def _expired(stack: support.Stack, count: int) -> bool:
    return (await support.statuses(stack.database_url)).get("expired", 0) == count


async def _drained(stack: support.Stack) -> bool:
    return await support.queue_depth(stack.amqp_url, "expirations") == 0


@pytest.fixture
async def store(stack: support.Stack) -> AsyncIterator[PostgresStore]:
    """The consumer's store on the test's database (no relay to wake)."""
    pool = await postgres.create_pool(stack.settings, application_name="test-events", size=4)
    try:
        yield PostgresStore(pool, stack.settings)
    finally:
        await pool.close()


# -- one event per expiry, and none for anything else ---------------------------------


@pytest.mark.parametrize("batch_size", [100, 1], ids=["batched", "per-message"])
async def test_every_expiry_writes_one_event_with_its_id_times_and_trace(
    stack: support.Stack, batch_size: int
) -> None:
    """Due holds expired by a real consumer (batched, and EXPIRY_BATCH_SIZE=1): one event
    each, its message id ``expired:<id>:<ms>``, its hold's deadline, the transition's
    time, and the command's traceparent (unsampled: recorded as it came); duplicates,
    holds not due and consumed holds write none."""
    due = await support.insert_holds(stack.database_url, 20)
    future = await support.insert_holds(stack.database_url, 2, due_in=3600)
    consumed = await support.insert_holds(stack.database_url, 2)
    async with support.pg_connection(stack.database_url) as conn:
        await conn.execute(
            "UPDATE reservations SET status = 'consumed' WHERE id = ANY($1::uuid[])", consumed
        )
    deadlines = await _deadlines(stack.database_url)
    traces = {rid: traceparent() for rid in deadlines}
    commands = [_command(rid, deadlines[rid], traces[rid]) for rid in deadlines]
    settings = stack.settings.model_copy(update={"batch_size": batch_size})
    async with support.attached_consumer(stack, settings):
        await publish_each(stack.amqp_url, [*commands, *commands[:5]])  # 5 twice
        await support.eventually(lambda: _expired(stack, len(due)))
        await support.eventually(lambda: _drained(stack))
    assert not {*future, *consumed} & set(await events_by_reservation(stack.database_url))
    await _assert_one_event_each(stack.database_url, {rid: traces[rid] for rid in due})


async def test_a_suspect_writes_its_event_and_its_trace(stack: support.Stack) -> None:
    """A redelivered command (someone held it and did not settle it) is expired alone by
    the quarantine: its event too, with its traceparent."""
    [rid] = await support.insert_holds(stack.database_url, 1)
    deadline = (await _deadlines(stack.database_url))[rid]
    trace = traceparent()
    await publish_each(stack.amqp_url, [_command(rid, deadline, trace)])
    connection = await aio_pika.connect(stack.amqp_url)
    channel = await connection.channel()
    queue = await channel.get_queue("expirations")
    taken = await queue.get(timeout=5)
    assert taken is not None
    await connection.close()  # not settled: the broker redelivers it, marked so
    async with support.attached_consumer(stack):
        await support.eventually(lambda: _expired(stack, 1))
    await _assert_one_event_each(stack.database_url, {rid: trace})


async def test_the_one_at_a_time_paths_write_the_event_with_the_trace_given(
    stack: support.Stack, store: PostgresStore
) -> None:
    """The single-row statement (a delivery alone, waiting or hardly waiting for its row)
    and a batch of one or many: each winner its event, with the trace it was given (None:
    NULL); a second try, already done, writes none."""
    ids = await support.insert_holds(stack.database_url, 6)
    traces = [traceparent(), None, traceparent(), traceparent(), None, traceparent()]
    for rid, trace, busy in zip(ids[:2], traces[:2], (False, True), strict=True):
        expiry = await store.expire_one(rid, Attempt(1, 0, "m"), busy=busy, traceparent=trace)
        assert expiry.outcome is Outcome.EXPIRED
    await store.expire_many([ids[2]], ["m"], [1], [traces[2]])
    await store.expire_many(ids[3:], ["m"] * 3, [1] * 3, traces[3:])
    again = await store.expire_one(ids[0], Attempt(2, 0, "m"), traceparent=traceparent())
    assert again.outcome is Outcome.ALREADY_DONE
    rows = await store.expire_many(ids, ["m"] * 6, [3] * 6, [traceparent()] * 6)
    assert not any(row.won for row in rows.values())
    await _assert_one_event_each(stack.database_url, dict(zip(ids, traces, strict=True)))


async def test_a_hold_consumed_at_its_deadline_gets_no_event(
    stack: support.Stack, store: PostgresStore
) -> None:
    """The support side consumes a hold while its batch runs (the row locked, then
    consumed): the batch skips it, alone it is not eligible; no event, no transition."""
    [rid] = await support.insert_holds(stack.database_url, 1)
    async with support.pg_connection(stack.database_url) as support_side:
        consuming = support_side.transaction()
        await consuming.start()
        await support_side.execute("UPDATE reservations SET status = 'consumed' WHERE id = $1", rid)
        [row] = (await store.expire_many([rid], ["m"], [1], [traceparent()])).values()
        assert (row.won, row.status, row.due) == (False, "held", True)  # skipped
        await consuming.commit()
    expiry = await store.expire_one(rid, Attempt(1, 0, "m"), busy=True, traceparent=None)
    assert expiry.outcome is Outcome.NOT_ELIGIBLE
    assert await events_by_reservation(stack.database_url) == {}
    assert await support.transitions_per_reservation(stack.database_url) == {}


async def test_an_expiry_that_rolls_back_leaves_no_event(stack: support.Stack) -> None:
    """The batched guarded update and its event in a transaction that then rolls back (a
    failure after the statement): the event was there inside it, and is gone with it."""
    [rid] = await support.insert_holds(stack.database_url, 1)
    async with support.pg_connection(stack.database_url) as conn:
        transaction = conn.transaction()
        await transaction.start()
        await postgres.expire_batch(conn, [rid, uuid.uuid4()], ["a", "b"], [1, 1], worker="w")
        assert await conn.fetchval("SELECT count(*) FROM expiry_events") == 1
        await transaction.rollback()  # a failure after the statement
    assert await events_by_reservation(stack.database_url) == {}
    assert await support.statuses(stack.database_url) == {"held": 1}


async def test_two_consumers_on_the_same_holds_write_one_event_each(
    stack: support.Stack,
) -> None:
    """Two consumers, every command published twice and the scan on top: each hold
    expires once and has one event."""
    ids = await support.insert_holds(stack.database_url, 200)
    deadlines = await _deadlines(stack.database_url)
    commands = [_command(rid, deadlines[rid], None) for rid in ids]
    other = stack.settings.model_copy(update={"worker_id": "second"})
    async with support.attached_consumer(stack), support.running_consumer(other) as task:
        await support.wait_for_consumers(stack.amqp_url, 2, task)
        await publish_each(stack.amqp_url, commands + commands)
        await scan.scan_once(stack.settings)
        await support.eventually(lambda: _expired(stack, len(ids)))
        await support.eventually(lambda: _drained(stack))
    events = await events_by_reservation(stack.database_url)
    assert {rid: len(found) for rid, found in events.items()} == dict.fromkeys(ids, 1)
    assert await support.transitions_per_reservation(stack.database_url) == dict.fromkeys(ids, 1)


async def test_a_writer_of_the_previous_release_still_writes_the_event(
    stack: support.Stack,
) -> None:
    """The guarded update of release 0.2.0 (no traceparent; it never notifies), run as
    expiry_consumer beside this release's: its expiry has its event, the trace NULL."""
    [rid] = await support.insert_holds(stack.database_url, 1)
    deadline = (await _deadlines(stack.database_url))[rid]
    url = support.as_role(stack.database_url, "expiry_consumer")
    async with support.pg_connection(url) as conn:
        await conn.execute(PREVIOUS_RELEASE_EXPIRY, rid, "m", 1, "old")
    [event] = (await events_by_reservation(stack.database_url))[rid]
    assert (event.message_id, event.traceparent) == (event_message_id(rid, deadline), None)


# Release 0.2.0's statement (service/adapters/postgres/reservations.py then).
PREVIOUS_RELEASE_EXPIRY = """
WITH expired AS (
    UPDATE reservations SET status = 'expired', updated_at = now()
     WHERE id = $1 AND status = 'held' AND hold_until <= now()
 RETURNING id
)
INSERT INTO reservation_transitions
       (reservation_id, from_status, to_status, message_id, attempt, worker)
SELECT id, 'held', 'expired', $2, $3, $4 FROM expired
"""


async def test_a_traced_consumer_records_its_span_or_the_commands_trace(
    stack: support.Stack,
) -> None:
    """A command without a traceparent: NULL when the consumer traces nothing (the
    default), else its consumer span's (sampled, in a trace of its own)."""
    [rid] = await support.insert_holds(stack.database_url, 1)
    deadline = (await _deadlines(stack.database_url))[rid]
    async with support.attached_consumer(stack):
        await publish_each(stack.amqp_url, [_command(rid, deadline, None)])
        await support.eventually(lambda: _expired(stack, 1))
    [event] = (await events_by_reservation(stack.database_url))[rid]
    if recorder_for("service.consume") is None:
        assert event.traceparent is None
    else:  # another test of this process installed tracing
        assert event.traceparent is not None
        assert event.traceparent.endswith("-01")


# -- the relays are woken after the commit, coalesced ---------------------------------


async def test_a_listening_relay_is_woken_after_a_consumers_expiry(stack: support.Stack) -> None:
    """A LISTENing connection hears ``expiry_events`` once a real consumer has expired a
    hold, and by then the event is committed (the NOTIFY comes after the commit)."""
    [rid] = await support.insert_holds(stack.database_url, 1)
    deadline = (await _deadlines(stack.database_url))[rid]
    async with listening(stack.database_url) as heard, support.attached_consumer(stack):
        await publish_each(stack.amqp_url, [_command(rid, deadline, None)])
        async with asyncio.timeout(10):
            await heard.arrived.wait()
        assert list(await events_by_reservation(stack.database_url)) == [rid]
    assert len(heard.at) == 1


async def test_a_thousand_single_hold_commits_pay_far_fewer_notifies(
    stack: support.Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EXPIRY_BATCH_SIZE=1: a thousand holds, each expired in a commit of its own, wake
    the relays at most once per EXPIRY_EVENTS_NOTIFY_MS (50 ms here) window, far fewer
    times than they commit, each notification sent heard, and the last commit is notified
    too."""
    # A window of 50 ms, not the default 10: on a loaded machine the thousand commits take
    # seconds (up to 250 windows of 10 ms: as many notifications as "far fewer" allows).
    count, window = 1000, 0.050
    # The gaps are read where each notification is sent: a listener hears them with its own
    # and the server's scheduling in between (two heard 7 ms apart under load, sent 50 apart).
    sent_at: list[float] = []
    pooled_notify = wakeup.pooled_notify

    def timed(pool: postgres.Pool, *, timeout: float) -> Callable[[], Awaitable[None]]:
        notify = pooled_notify(pool, timeout=timeout)

        async def sending() -> None:
            sent_at.append(time.monotonic())
            await notify()

        return sending

    monkeypatch.setattr(wakeup, "pooled_notify", timed)
    ids = await support.insert_holds(stack.database_url, count)
    deadlines = await _deadlines(stack.database_url)
    settings = stack.settings.model_copy(
        update={"batch_size": 1, "events_notify_ms": round(window * 1000)}
    )
    # Waiting in the queue first, so that the consumer takes them as fast as it can.
    await publish_each(stack.amqp_url, [_command(r, deadlines[r], None) for r in ids])
    async with listening(stack.database_url) as heard, support.attached_consumer(stack, settings):
        await support.eventually(lambda: _expired(stack, count), timeout=60)
        await support.eventually(lambda: _heard(heard.at, len(sent_at)))
        async with support.pg_connection(stack.database_url) as conn:
            span = await conn.fetchval(
                "SELECT extract(epoch FROM max(at) - min(at))::float8 FROM reservation_transitions"
            )
    elapsed = float(span)
    sent = len(heard.at)
    print(f"{count} single-hold commits in {elapsed:.2f}s woke the relays {sent} times")
    assert sent == len(sent_at), (sent, len(sent_at))  # each one sent was heard, no other
    assert 1 <= sent <= elapsed / window + 2, (sent, elapsed)
    assert sent < count / 4, (sent, elapsed)
    gaps = [b - a for a, b in itertools.pairwise(sent_at)]
    assert not gaps or sum(gap >= window / 2 for gap in gaps) >= len(gaps) * 0.9, gaps


async def _heard(at: list[float], sent: int) -> bool:
    return len(at) >= sent
