"""``python -m service.relay`` as a user runs it: SIGTERM in the middle of a backlog, a
SIGKILL between its publish and its mark, its endpoint, and the refusals at its start."""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from collections import Counter

import aio_pika
import httpx
import pytest

from service.adapters import postgres
from tests import support
from tests.acceptance.processes import run, start, stop
from tests.events_support import (
    all_sent,
    bind_reader_queue,
    collect_events,
    insert_events,
    outbox,
    running_relay,
    take_events,
)

pytestmark = pytest.mark.acceptance

RELAY = "service.relay"


def _lines(output: str) -> list[dict[str, object]]:
    """The JSON log lines of a process (EXPIRY_LOG_FORMAT=json)."""
    found = []
    for line in output.splitlines():
        if line.startswith("{"):
            found.append(json.loads(line))
    return found


def _events(output: str, name: str) -> list[dict[str, object]]:
    return [line for line in _lines(output) if line.get("event") == name]


async def _sent_at_least(stack: support.Stack, count: int) -> bool:
    return len((await outbox(stack)).sent) >= count


async def test_sigterm_in_a_backlog_finishes_the_batch_in_hand_and_exits_zero(
    stack: support.Stack,
) -> None:
    """SIGTERM while it drains 20,000 events: it stops after the batch in hand, published and
    marked (what the reader got is exactly what is marked sent, nothing is left leased),
    exits 0; a second relay publishes the rest, each event once."""
    queue = await bind_reader_queue(stack.amqp_url)
    mids = await insert_events(stack, 20_000)
    env = stack.env(EXPIRY_RELAY_BATCH_SIZE="200", EXPIRY_RELAY_POLL_SECONDS="0.2")
    relay = await start(RELAY, env=env)
    await support.eventually(lambda: _sent_at_least(stack, 1000), timeout=60)
    code, output = await stop(relay, signal.SIGTERM)
    assert code == 0, output
    state = await outbox(stack)
    received = await take_events(stack.amqp_url, queue)
    assert state.leased == 0  # the batch in hand was marked, none left to lapse
    assert 0 < len(state.sent) < len(mids)
    assert sorted(e.message_id for e in received) == sorted(state.sent)
    [stopped] = _events(output, "relay.stopped")
    assert stopped["published"] == len(state.sent)
    relay = await start(RELAY, env=env)
    await support.eventually(lambda: all_sent(stack, len(mids)), timeout=120)
    code, output = await stop(relay, signal.SIGTERM)
    assert code == 0, output
    received += await take_events(stack.amqp_url, queue)
    assert Counter(e.message_id for e in received) == Counter(set(mids))


async def test_a_relay_killed_between_its_publish_and_its_mark_publishes_again_with_the_same_ids(
    stack: support.Stack,
) -> None:
    """Killed (exit 137, as SIGKILL) once its first batch was confirmed, before the mark: the
    events stay pending under its lease; once the lease lapsed the next relay publishes
    them again, with the same message ids, and marks everything sent."""
    queue = await bind_reader_queue(stack.amqp_url)
    mids = await insert_events(stack, 120)
    env = stack.env(
        EXPIRY_RELAY_BATCH_SIZE="50",
        EXPIRY_RELAY_LEASE_SECONDS="1",
        EXPIRY_PUBLISH_TIMEOUT_SECONDS="0.5",  # under the lease (a local broker: ms)
        EXPIRY_RELAY_POLL_SECONDS="0.2",
    )
    killed = await start(RELAY, env=env | {"EXPIRY_FAILPOINT": "exit-after-publish"})
    async with asyncio.timeout(60):
        code = await killed.wait()
    code, output = await stop(killed)
    assert code == 137, output
    first = await take_events(stack.amqp_url, queue)
    state = await outbox(stack)
    assert len(first) == 50
    assert not state.sent
    assert {m for m, claims in state.pending.items() if claims == 1} == {
        e.message_id for e in first
    }
    await asyncio.sleep(1.1)  # the dead relay's lease lapses
    relay = await start(RELAY, env=env)
    await support.eventually(lambda: all_sent(stack, len(mids)), timeout=60)
    code, output = await stop(relay, signal.SIGTERM)
    assert code == 0, output
    second = await take_events(stack.amqp_url, queue)
    assert Counter(e.message_id for e in first + second) == Counter(
        {m: 2 if m in {e.message_id for e in first} else 1 for m in mids}
    )
    sent = (await outbox(stack)).sent
    assert sorted(sent.values()) == sorted([1] * 70 + [2] * 50)
    [stopped] = _events(output, "relay.stopped")
    assert stopped["republished"] == 50


async def test_the_endpoint_says_ready_and_serves_the_relays_metrics(stack: support.Stack) -> None:
    """With EXPIRY_HTTP_PORT: /readyz 200 once it drains, listens and reaches both servers;
    /metrics counts what it published."""
    await bind_reader_queue(stack.amqp_url)
    await insert_events(stack, 30)
    port = support.free_port()
    env = stack.env(EXPIRY_HTTP_PORT=str(port), EXPIRY_RELAY_POLL_SECONDS="0.2")
    relay = await start(RELAY, env=env)
    try:
        await support.eventually(lambda: all_sent(stack, 30), timeout=30)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
            await support.until_ready(http)
            checks = (await http.get("/readyz")).json()
            metrics = (await http.get("/metrics")).text
    finally:
        code, output = await stop(relay, signal.SIGTERM)
    assert code == 0, output
    expected = {"ready": True, "draining": True, "broker": True, "database": True}
    if stack.settings.db_pooler == "none":  # behind a transaction pooler it polls alone
        expected["listening"] = True
    assert checks == expected
    assert "expiry_relay_published_total" in metrics
    assert "expiry_event_commit_to_confirm_seconds_bucket" in metrics


async def test_it_refuses_to_start_without_the_events_exchange(
    bare_stack: support.Stack,
) -> None:
    """Nothing declared: one line naming the exchange and the command to run, exit 1."""
    result = await asyncio.to_thread(run, RELAY, env=bare_stack.env())
    assert result.returncode == 1, result.stderr
    [line] = [text for text in result.stderr.splitlines() if "failed:" in text]
    assert "exchange 'expiry.events' does not exist" in line
    assert "python -m service.declare" in line


async def test_it_refuses_to_start_on_a_database_not_migrated(stack: support.Stack) -> None:
    """A database without the outbox: one line saying to migrate, exit 5."""
    async with support.pg_connection(stack.database_url) as conn:
        await conn.execute("DELETE FROM schema_migrations WHERE version = '0014_events'")
    result = await asyncio.to_thread(run, RELAY, env=stack.env())
    assert result.returncode == 5, result.stderr
    assert "python -m service.migrate" in result.stderr


async def test_it_refuses_a_claim_its_publish_may_outlive(stack: support.Stack) -> None:
    """EXPIRY_RELAY_LEASE_SECONDS not longer than EXPIRY_PUBLISH_TIMEOUT_SECONDS: one line
    naming both, exit 2, before anything is opened."""
    env = stack.env(EXPIRY_RELAY_LEASE_SECONDS="10", EXPIRY_PUBLISH_TIMEOUT_SECONDS="10")
    result = await asyncio.to_thread(run, RELAY, env=env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        "python -m service.relay: refused: EXPIRY_RELAY_LEASE_SECONDS (10) must exceed "
        "EXPIRY_PUBLISH_TIMEOUT_SECONDS (10), and by the mark's round trip: a batch's claim "
        "must outlive its publish"
    )


async def test_replay_to_sends_a_queue_bound_later_the_kept_events_and_no_one_else(
    stack: support.Stack,
) -> None:
    """Three expiries published to a reader bound before; a queue declared after gets
    none; --replay-to it, as the operator: the three, with their message ids, on that
    queue alone (the first reader gets no copy), audited; an unknown queue is refused in
    one line (exit 2)."""
    early = await bind_reader_queue(stack.amqp_url)
    ids = await support.insert_holds(stack.database_url, 3)
    async with support.pg_connection(stack.database_url) as conn:
        await postgres.expire_batch(conn, ids, ["a", "b", "c"], [1, 1, 1], worker="w")
    async with running_relay(stack.with_settings(relay_poll_seconds=0.2).settings):
        await support.eventually(lambda: all_sent(stack, 3))
    first = await collect_events(stack.amqp_url, early, 3)
    late = await _declared_unbound(stack.amqp_url)
    env = stack.env(
        DATABASE_URL=support.as_role(stack.database_url, "expiry_operator"),
        EXPIRY_REPLAY_OPERATORS="alice",
    )
    asked = ("--replay-to", late, "--since", "1h", "--operator", "alice")
    done = await asyncio.to_thread(run, RELAY, *asked, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    [line] = done.stdout.splitlines()
    assert line.startswith(f"replay to queue {late} from ")
    assert line.endswith(": 3 event(s) published and confirmed, 0 not")
    replayed = await collect_events(stack.amqp_url, late, 3)
    assert sorted(e.message_id for e in replayed) == sorted(e.message_id for e in first)
    assert await take_events(stack.amqp_url, early) == []  # no copy for the first reader
    async with support.pg_connection(stack.database_url) as conn:
        audit = await conn.fetch(
            "SELECT kind, target, events, outcome, operator FROM history_requests"
        )
    assert [tuple(row) for row in audit] == [("replay-to", late, 3, "done", "alice")]
    missing = await asyncio.to_thread(
        run, RELAY, "--replay-to", "nowhere", "--since", "1h", "--operator", "alice", env=env
    )
    assert missing.returncode == 2, missing.stdout + missing.stderr
    assert missing.stderr.strip() == (
        "python -m service.relay: refused: --replay-to: no queue 'nowhere' on the broker: "
        "declare and bind it first (docs/events.md)"
    )


async def _declared_unbound(amqp_url: str) -> str:
    """A durable queue bound to nothing (as a reader's, before it binds): its name."""
    name = f"late-{uuid.uuid4().hex[:8]}"
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(name, durable=True)
    return name
