"""The outbox and its relay against the real PostgreSQL and RabbitMQ: one event per expiry,
published with its stable id, none for what did not expire or did not commit; several
relays at once; a lease lost before the mark; the broker away and an exchange nobody
reads; the listener that wakes the relay and notices a connection that died silently.

The relay runs in-process here (``service.relay.run``); ``tests/acceptance/test_relay.py``
runs ``python -m service.relay`` (SIGTERM, SIGKILL between publish and mark, exits).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter
from datetime import datetime

import pytest

from service import scan
from service.adapters import postgres
from service.adapters.postgres.outbox import CHANNEL
from service.adapters.telemetry.relay_metrics import RelayMetrics
from service.core.domain import command_body, message_id
from service.core.events import EVENT
from service.core.topology import EVENT_ROUTING_KEY, EVENTS_EXCHANGE
from service.relay import listener as relay_listener
from service.relay import run
from service.relay.listener import Listener, listening
from tests.events_support import (
    all_sent,
    bind_reader_queue,
    collect_events,
    expected_message_id,
    insert_events,
    outbox,
    running_relay,
    take_events,
)
from tests.proxy import tcp_proxy
from tests.recipes import database_behind_proxy
from tests.support import (
    Stack,
    attached_consumer,
    eventually,
    insert_holds,
    pg_connection,
    publish_raw,
    running_consumer,
    running_until_stopped,
    statuses,
    wait_for_consumers,
)

pytestmark = pytest.mark.integration


def _relaying(stack: Stack, **overrides: object) -> Stack:
    """The stack with a relay that looks often (the consumers of this tree may not NOTIFY)."""
    return stack.with_settings(relay_poll_seconds=0.2, **overrides)


async def _expired(stack: Stack, count: int) -> bool:
    return (await statuses(stack.database_url)).get("expired", 0) == count


async def _holds(stack: Stack, ids: list[uuid.UUID]) -> dict[uuid.UUID, datetime]:
    async with pg_connection(stack.database_url) as conn:
        rows = await conn.fetch(
            "SELECT id, hold_until FROM reservations WHERE id = ANY($1::uuid[])", ids
        )
    return {row["id"]: row["hold_until"] for row in rows}


async def test_every_expiry_gives_one_event_row_and_one_published_message(stack: Stack) -> None:
    """Holds expired by the scan and a consumer: one outbox row each, and one message each on
    a reader's queue, in the contract's form, with the hold's stable message id."""
    stack = _relaying(stack)
    queue = await bind_reader_queue(stack.amqp_url)
    ids = await insert_holds(stack.database_url, 300)
    holds = await _holds(stack, ids)
    async with running_relay(stack.settings), attached_consumer(stack):
        await scan.scan_once(stack.settings)
        await eventually(lambda: _expired(stack, len(ids)))
        received = await collect_events(stack.amqp_url, queue, len(ids))
        await eventually(lambda: all_sent(stack, len(ids)))
    wanted = {expected_message_id(rid, until) for rid, until in holds.items()}
    assert sorted(e.message_id for e in received) == sorted(wanted)
    for event in received:
        rid = uuid.UUID(event.body["reservation_id"])
        assert event.message_id == expected_message_id(rid, holds[rid])
        assert event.body["event"] == EVENT
        assert datetime.fromisoformat(event.body["hold_until"]) == holds[rid]
        assert datetime.fromisoformat(event.body["expired_at"]).tzinfo is not None
        assert (event.routing_key, event.content_type, event.delivery_mode) == (
            EVENT_ROUTING_KEY,
            "application/json",
            2,
        )
        assert event.message_type == EVENT
    state = await outbox(stack)
    assert set(state.sent) == wanted
    assert set(state.sent.values()) == {1}


async def test_duplicate_commands_give_no_second_event(stack: Stack) -> None:
    """Each command published three times (a redelivery, a replay) and taken by two
    consumers: one event per expired hold, no more."""
    stack = _relaying(stack)
    queue = await bind_reader_queue(stack.amqp_url)
    ids = await insert_holds(stack.database_url, 100)
    holds = await _holds(stack, ids)
    bodies = [command_body(rid, until) for rid, until in holds.items()]
    mids = [message_id(rid, until) for rid, until in holds.items()]
    async with running_consumer(stack.settings) as one, running_consumer(stack.settings) as two:
        await wait_for_consumers(stack.amqp_url, 2, one)
        assert not two.done()
        for _copy in range(3):
            await publish_raw(stack.amqp_url, bodies, message_ids=mids)
        await eventually(lambda: _expired(stack, len(ids)))
        await scan.scan_once(stack.settings)  # nothing due any more: publishes nothing
    async with running_relay(stack.settings):
        await eventually(lambda: all_sent(stack, len(ids)))
    received = await take_events(stack.amqp_url, queue)
    assert Counter(e.message_id for e in received) == Counter(
        expected_message_id(rid, until) for rid, until in holds.items()
    )


async def test_a_rolled_back_expiry_leaves_no_event(stack: Stack) -> None:
    """The guarded update won, then its transaction rolled back: no event row, nothing
    published; the hold expired later gives exactly one."""
    [rid] = await insert_holds(stack.database_url, 1)
    async with pg_connection(stack.database_url) as conn:
        transaction = conn.transaction()
        await transaction.start()
        expiry = await postgres.expire_reservation(
            conn, rid, message_id="m-1", attempt=1, worker="test"
        )
        assert expiry.outcome.value == "expired"
        assert await conn.fetchval("SELECT count(*) FROM expiry_events") == 1  # inside it
        await transaction.rollback()
        assert await conn.fetchval("SELECT count(*) FROM expiry_events") == 0
        await postgres.expire_reservation(conn, rid, message_id="m-2", attempt=1, worker="test")
        assert await conn.fetchval("SELECT count(*) FROM expiry_events") == 1


async def test_the_effect_run_twice_on_the_same_hold_leaves_one_event(stack: Stack) -> None:
    """The seed's first check: the guarded expiry run twice against the same fixture (the
    second already-done) writes one event, and one is published."""
    stack = _relaying(stack)
    queue = await bind_reader_queue(stack.amqp_url)
    [rid] = await insert_holds(stack.database_url, 1)
    async with pg_connection(stack.database_url) as conn:
        outcomes = [
            (await postgres.expire_reservation(conn, rid, message_id=m, attempt=1, worker="t"))
            for m in ("first", "second")
        ]
    assert [o.outcome.value for o in outcomes] == ["expired", "already-done"]
    async with running_relay(stack.settings):
        await eventually(lambda: all_sent(stack, 1))
    assert len(await take_events(stack.amqp_url, queue)) == 1


async def test_a_lease_lost_before_the_mark_converges_to_the_same_end_state(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The seed's second check, on the relay: its lease lapses between the publish (the
    effect) and the mark (the completion); the mark matches nothing and says so loudly,
    the next claim publishes the same ids again, and the end state is the one a clean run
    leaves: every event sent once, none pending, each id on the reader's queue."""
    caplog.set_level(logging.INFO)
    stack = _relaying(stack, relay_lease_seconds=1.0, publish_timeout_seconds=0.5)
    queue = await bind_reader_queue(stack.amqp_url)
    mids = await insert_events(stack, 20)
    from service.adapters.postgres import outbox as outbox_sql
    from service.relay import pump

    real_mark = outbox_sql.mark_sent
    slowed = 0

    async def mark_late(*args: object, **kwargs: object) -> int:
        nonlocal slowed
        if slowed == 0:  # the first mark only: its lease runs out meanwhile
            slowed += 1
            await asyncio.sleep(1.5)
        return await real_mark(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pump, "mark_sent", mark_late)
    async with running_relay(stack.settings) as relay:
        await eventually(lambda: all_sent(stack, len(mids)))
    ledger = (await relay).ledger
    [lost] = [r for r in caplog.records if r.msg == "relay.mark_lost"]
    assert (lost.published, lost.marked, lost.lost) == (20, 0, 20)  # type: ignore[attr-defined]
    assert (ledger.marks_lost, ledger.republished) == (20, 20)
    state = await outbox(stack)
    assert set(state.sent) == set(mids)
    assert set(state.sent.values()) == {2}
    received = await take_events(stack.amqp_url, queue)
    assert Counter(e.message_id for e in received) == Counter({m: 2 for m in mids})


async def test_two_relays_never_publish_the_same_event_twice_within_a_lease(
    stack: Stack,
) -> None:
    """Two relays drain one outbox of 3,000 events at once: each event published once,
    each claimed once, both relays did some of the work."""
    stack = _relaying(stack, relay_batch_size=100)
    queue = await bind_reader_queue(stack.amqp_url)
    mids = await insert_events(stack, 3000)
    started = time.monotonic()
    async with running_relay(stack.settings) as one, running_relay(stack.settings) as two:
        await eventually(lambda: all_sent(stack, len(mids)), timeout=120)
        elapsed = time.monotonic() - started
    shares = [(await relay).ledger.published for relay in (one, two)]
    received = await take_events(stack.amqp_url, queue)
    assert Counter(e.message_id for e in received) == Counter(set(mids))
    assert set((await outbox(stack)).sent.values()) == {1}
    assert sum(shares) == len(mids)
    assert min(shares) > 0, shares
    print(f"two relays: {len(mids)} events in {elapsed:.2f}s, {shares}")


async def test_an_event_nobody_reads_stays_pending_and_is_published_once_a_queue_binds(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """No queue bound to the exchange: the broker returns the events (mandatory), none is
    marked sent, one warning line names the exchange; once a reader binds a queue, every
    event arrives."""
    caplog.set_level(logging.INFO)
    stack = _relaying(stack, relay_lease_seconds=120.0)
    mids = await insert_events(stack, 10)

    async def given_back() -> bool:
        # the relay claims them again after each pause (1 s, 2 s, ...), so a read may land
        # inside a claim; given back at once is a read with none leased well within the lease
        return (await outbox(stack)).leased == 0

    async with running_relay(stack.settings):
        await eventually(lambda: _said(caplog, "relay.unroutable"))
        await eventually(given_back, timeout=30)
        state = await outbox(stack)
        assert set(state.pending) == set(mids)
        assert not state.sent
        queue = await bind_reader_queue(stack.amqp_url)
        received = await collect_events(stack.amqp_url, queue, len(mids))
        await eventually(lambda: all_sent(stack, len(mids)))
    assert sorted(e.message_id for e in received) == sorted(mids)
    warning = next(r for r in caplog.records if r.msg == "relay.unroutable")
    assert warning.levelno == logging.WARNING
    assert warning.exchange == EVENTS_EXCHANGE  # type: ignore[attr-defined]


async def test_with_unroutable_drop_an_event_nobody_reads_is_confirmed_and_marked_sent(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """EXPIRY_EVENTS_UNROUTABLE=drop (no reader but the webhooks): the events are published
    without mandatory, the broker confirms and drops them, and the relay marks them sent;
    nothing is said unroutable and the outbox is empty."""
    caplog.set_level(logging.INFO)
    stack = _relaying(stack, events_unroutable="drop")
    mids = await insert_events(stack, 10)
    async with running_relay(stack.settings):
        await eventually(lambda: all_sent(stack, len(mids)))
    state = await outbox(stack)
    assert (state.pending, sorted(state.sent)) == ({}, sorted(mids))
    assert not await _said(caplog, "relay.unroutable")


async def _said(caplog: pytest.LogCaptureFixture, event: str) -> bool:
    return any(r.msg == event for r in caplog.records)


async def test_the_broker_away_then_back_every_event_arrives(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """The relay's broker connection cut, events written meanwhile: they wait in the outbox
    (not one marked sent), the relay reconnects when the broker is back and every event
    arrives."""
    caplog.set_level(logging.INFO)
    queue = await bind_reader_queue(stack.amqp_url)
    async with tcp_proxy(stack.amqp_url, 5672) as proxy:
        relaying = _relaying(stack, amqp_url=(proxy.url(stack.amqp_url),))
        async with running_relay(relaying.settings):
            before = await insert_events(stack, 50)
            await eventually(lambda: all_sent(stack, len(before)))
            proxy.cut()
            during = await insert_events(stack, 50)
            await asyncio.sleep(4)
            state = await outbox(stack)
            assert set(state.pending) == set(during)
            proxy.restore()
            await eventually(lambda: all_sent(stack, 100), timeout=60)
    received = await take_events(stack.amqp_url, queue)
    assert set(e.message_id for e in received) == set(before) | set(during)
    assert _said_sync(caplog, "relay.publish_failed")


def _said_sync(caplog: pytest.LogCaptureFixture, event: str) -> bool:
    return any(r.msg == event for r in caplog.records)


class _Looks(RelayMetrics):
    """A relay's metrics that count its looks into the outbox made while it listened."""

    def __init__(self) -> None:
        super().__init__()
        self.listening = 0

    def looked(self) -> None:
        super().looked()
        if self.is_listening():
            self.listening += 1


async def test_a_notify_wakes_the_relay_long_before_its_poll(stack: Stack) -> None:
    """With a poll of a minute, an event followed by a NOTIFY is published within a second
    (from the NOTIFY to its mark, by the database's clock)."""
    stack = stack.with_settings(relay_poll_seconds=60.0)
    queue = await bind_reader_queue(stack.amqp_url)
    looks = _Looks()

    async def listening_and_looked() -> bool:
        return looks.listening > 0

    async with running_until_stopped(lambda stop: run(stack.settings, stop, metrics=looks)):
        await eventually(listening_and_looked)  # listening, and past its first look
        [mid] = await insert_events(stack, 1)
        async with pg_connection(stack.database_url) as conn:
            notified = await conn.fetchval("SELECT clock_timestamp()")
            await conn.execute(f"NOTIFY {CHANNEL}")
        # Waited for on the database (a reader's connections are slow to make on a loaded
        # machine); the time it took is the relay's own, read from its mark.
        await eventually(lambda: all_sent(stack, 1), timeout=30)
        async with pg_connection(stack.database_url) as conn:
            marked = await conn.fetchval(
                "SELECT at FROM expiry_events_sent WHERE message_id = $1", mid
            )
        [event] = await collect_events(stack.amqp_url, queue, 1)
    waited = (marked - notified).total_seconds()
    assert event.message_id == mid
    assert waited < 1.0, waited


async def test_a_listener_that_died_silently_is_noticed_and_listens_again(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The listening connection stops answering (its server's replies held: a half-open
    connection): the check's SELECT 1 times out, the listener says so, listens on a new
    connection, wakes the relay once, and a NOTIFY reaches it again."""
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(relay_listener, "CHECK_SECONDS", 0.3)
    monkeypatch.setattr(relay_listener, "CHECK_TIMEOUT_SECONDS", 0.5)
    wake = asyncio.Event()
    async with database_behind_proxy(stack) as db, listening(db.settings, wake) as listener:
        await eventually(lambda: _listens(listener), timeout=10)
        wake.clear()
        [link] = [link for link in db.proxy.links if not link.closed]
        link.hold_replies = True  # nothing the server says reaches the listener any more
        await eventually(lambda: _said(caplog, "relay.listener_lost"), timeout=10)
        await eventually(lambda: _listens_again(listener, caplog), timeout=10)
        assert wake.is_set()  # woken once, for what it may have missed
        wake.clear()
        async with pg_connection(stack.database_url) as conn:
            await conn.execute(f"NOTIFY {CHANNEL}")
        async with asyncio.timeout(5):
            await wake.wait()
    [lost] = [r for r in caplog.records if r.msg == "relay.listener_lost"]
    assert "SELECT 1" in lost.reason  # type: ignore[attr-defined]


async def _listens(listener: Listener) -> bool:
    return listener.listening


async def _listens_again(listener: Listener, caplog: pytest.LogCaptureFixture) -> bool:
    again = [r for r in caplog.records if r.msg == "relay.listening" and hasattr(r, "deaf_seconds")]
    return listener.listening and bool(again)
