"""Claims and their settling against the real PostgreSQL, statement by statement, as a
deliverer makes them (``deliveries.py``, ``webhook_endpoints.py``): a claim that lapsed
settles nothing; a batch of answers settles each row by its own lease; the shared
bucket's pause and probe.

The whole deliverer, in-process against HTTP receivers: ``test_webhooks.py``.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from service.adapters.postgres import deliveries as rows
from service.adapters.postgres import webhook_endpoints
from service.adapters.postgres.pool import Connection
from tests.events_support import insert_events
from tests.support import Stack, pg_connection
from tests.webhook_support import (
    Receiver,
    attempted,
    attempts,
    claimed,
    deliveries,
    delivering,
    new_secret,
    register,
)

# one_broker: PostgreSQL only.
pytestmark = [pytest.mark.integration, pytest.mark.one_broker]


async def test_a_lapsed_claim_settles_nothing(stack: Stack) -> None:
    """A claim whose lease ran out marks nothing done, puts nothing off, kills nothing;
    the next claim takes the delivery; every attempt is in the log all the same (each
    request went out)."""
    stack = delivering(stack, Receiver(new_secret(), port=9).endpoint())  # never sent to
    await register(stack)
    [event] = await insert_events(stack, 1)
    first, second = uuid.uuid4(), uuid.uuid4()
    ok, failed = attempted("orders", event), attempted("orders", event, 500, "x")
    async with pg_connection(stack.database_url) as conn:
        [first_claim] = await claimed(conn, "orders", 5, lease_seconds=0.2, token=first)
        await asyncio.sleep(0.4)
        assert not await rows.delivered(conn, first_claim.id, token=first, attempted=ok)
        assert not await rows.put_off(
            conn, first_claim.id, token=first, seconds=0, attempted=failed
        )
        [again] = await claimed(conn, "orders", 5, lease_seconds=30, token=second)
        assert not await rows.delivered(conn, again.id, token=first, attempted=ok)
        assert await rows.delivered(conn, again.id, token=second, attempted=ok)
    assert await deliveries(stack) == []
    logged = [(row["status"], row["error_class"]) for row in await attempts(stack)]
    assert logged == [(200, None), (500, "x"), (200, None), (200, None)]


async def test_a_batch_of_answers_records_each_row_by_its_own_lease(stack: Stack) -> None:
    """Answers settled in one statement: the deliveries whose lease holds are done, the
    one whose lease lapsed and the one another deliverer claimed since are left for their
    next claim; every attempt of the batch is in the log."""
    stack = delivering(stack, Receiver(new_secret(), port=9).endpoint())  # never sent to
    await register(stack)
    events = await insert_events(stack, 4)
    mine, other = uuid.uuid4(), uuid.uuid4()
    async with pg_connection(stack.database_url) as conn:
        held = await claimed(conn, "orders", 2, lease_seconds=30, token=mine)
        short = await claimed(conn, "orders", 2, lease_seconds=0.2, token=mine)
        await asyncio.sleep(0.4)
        [again] = await claimed(conn, "orders", 1, lease_seconds=30, token=other)
        [lapsed] = [d for d in short if d.id != again.id]  # and still not claimed again
        answered = [(d.id, attempted("orders", d.message_id)) for d in [*held, *short]]
        done = await rows.delivered_all(conn, answered, token=mine)
    assert done == {d.id for d in held}
    left = {row["message_id"] for row in await deliveries(stack)}
    assert left == {lapsed.message_id, again.message_id}
    assert sorted(row["message_id"] for row in await attempts(stack)) == sorted(events)


async def test_a_pause_is_not_lengthened_by_attempts_that_were_in_flight(stack: Stack) -> None:
    """Failures in a row pause the endpoint; failures of attempts in flight when it paused
    change nothing; when the pause ends one probe goes, and nobody else sends until its
    answer: a failed probe pauses it twice as long, an answered one ends the pause; a
    probe that finds nothing due is not taken (the next look probes again)."""
    stack = delivering(stack, Receiver(new_secret(), port=9).endpoint())
    await register(stack)
    # Pauses far longer than any run of the statements below, each ended by moving its end
    # to the database's clock (as time passing it would), and a rate that refills the bucket
    # within microseconds: what is granted never depends on how fast the machine is.
    pause = 30.0
    token = uuid.uuid4()

    async def fail(conn: Connection) -> bool:
        return await webhook_endpoints.failed(
            conn, "orders", pause_after=2, first=pause, cap=10 * pause
        )

    async def claim(conn: Connection) -> rows.Claim:
        return await rows.claim(
            conn,
            "orders",
            5,
            rate=1_000_000,
            burst=10,
            probe_seconds=30,
            lease_seconds=30,
            token=token,
        )

    async def pause_ends(conn: Connection) -> None:
        await conn.execute("UPDATE webhook_endpoints SET paused_until = clock_timestamp()")

    async with pg_connection(stack.database_url) as conn:
        assert not await fail(conn)
        assert await fail(conn)  # the second in a row: paused
        assert not await fail(conn)  # in flight when it paused: nothing
        assert not await fail(conn)
        pauses = await conn.fetchval("SELECT pauses FROM webhook_endpoints")
        assert pauses == 1
        took = (await claim(conn)).tokens
        assert (took.granted, took.wait > 0, took.probe) == (0, True, False)
        await pause_ends(conn)
        nothing = await claim(conn)  # nothing due: the probe is not taken
        assert (nothing.tokens.granted, nothing.tokens.probe, nothing.deliveries) == (1, False, [])
        again = (await claim(conn)).tokens
        assert (again.granted, again.probe) == (1, False)
        first, second = await insert_events(stack, 2)
        probe = await claim(conn)
        assert (probe.tokens.granted, probe.tokens.wait, probe.tokens.probe) == (1, 0.0, True)
        assert [d.message_id for d in probe.deliveries] == [first]  # alone, now
        other = await claim(conn)
        assert (other.tokens.granted, other.deliveries) == (0, [])  # nobody else meanwhile
        before = await conn.fetchval("SELECT clock_timestamp()")
        assert await fail(conn)  # the probe failed: paused again, twice as long
        row = await conn.fetchrow(
            "SELECT pauses, extract(epoch FROM paused_until - $1::timestamptz)::float8 AS since,"
            " extract(epoch FROM paused_until - clock_timestamp())::float8 AS left"
            " FROM webhook_endpoints",
            before,
        )
        assert row is not None
        assert row["pauses"] == 2
        # Twice the first pause, from the failure: after ``before``, before this read.
        assert row["left"] <= 2 * pause <= row["since"]
        await pause_ends(conn)
        probe = await claim(conn)
        assert (probe.tokens.granted, probe.tokens.probe) == (1, True)
        [sent] = probe.deliveries
        assert sent.message_id == second
        done = await rows.delivered(
            conn, sent.id, token=token, attempted=attempted("orders", second)
        )
        assert done  # answered 2xx: the pause is over
        after = (await claim(conn)).tokens
        assert (after.granted, after.wait, after.probe) == (5, 0.0, False)
