"""Hostile messages through the real broker, to every queue the service consumes.

Whoever can publish to our exchanges can send any header of any AMQP type, any
body, any message id, and (with a client less careful than aio-pika) bytes
that are not UTF-8 and timestamps past the year 9999. Each test sends such a
set, then checks that every delivery was settled (after the consumer stops,
nothing comes back to its queue), that each dead letter has its record, and
that the consumer stayed alive and did its other work exactly once.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import struct
import uuid
from decimal import Decimal
from typing import Any

import aio_pika
import pytest
from pamqp import commands

from service import deadletters, scan
from service.adapters.amqp.declaring import topology_for
from service.adapters.amqp.returns import REFRESH_AT
from service.core.domain import command_body
from service.core.retry import REFUSAL_LIMIT
from service.settings import Settings
from tests import support
from tests.rawamqp import RawMessage, publish_raw_frames, replace_bytes
from tests.recipes import consumer_cut_off, database_behind_proxy

pytestmark = pytest.mark.integration

WHEN = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
WHEN_BYTES = struct.pack(">Q", int(WHEN.timestamp()))
FAR = struct.pack(">Q", 2**64 - 1)
FAR_MS = struct.pack(">Q", 2**63)

# One value of every field type aio-pika can send and the broker accepts, hostile
# where a type allows it (RabbitMQ refuses NaN and infinities itself, closing the
# publisher's connection; the unit tests give those to the readers directly).
HOSTILE_VALUES: list[Any] = [
    4611686018427387904,
    -1000000000000000,
    -(2**63),
    2**63 - 1,
    -1,
    0,
    True,
    1.5,
    -3.0e38,
    Decimal("2147483.647"),
    Decimal("-0.001"),
    bytearray(b"\x00\xff\xfe"),
    "\x00\x1b[2J\x1b[31m\u202e",
    "x" * 60000,
    {"nested": {"table": [1, "two", None, bytearray(b"\x00")]}},
    [[[1]], {"a": -(2**40)}],
    datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC),
    datetime.datetime(9999, 12, 31, 23, 59, 59, tzinfo=datetime.UTC),
    None,
]
OUR_HEADERS = [
    "x-expiry-attempt",
    "x-expiry-first-seen",
    "x-expiry-last-seen",
    "x-expiry-error-class",
    "x-expiry-reason",
    "x-expiry-worker",
    "x-delivery-count",
    "x-death",
]
POISON_BODIES = [
    b"\x00",
    b"not json \x00\x1b[31m",
    b"\xff\xfe\xfd",
    b"[" * 20000,
    b'{"reservation_id": "\x00", "hold_until": 5}',
    b'{"reservation_id": "not-a-uuid", "hold_until": "2020-01-01T00:00:00+00:00"}',
    b"7",
    b"x" * 100_000,
]
ISSUE_HEADERS = {"x-expiry-attempt": 4611686018427387904, "x-expiry-first-seen": -1000000000000000}


def _hostile_headers(index: int) -> dict[str, Any]:
    """Our own header names (and x-death) holding values of every type, rotated."""
    headers = {
        name: HOSTILE_VALUES[(index + offset) % len(HOSTILE_VALUES)]
        for offset, name in enumerate(OUR_HEADERS)
    }
    headers["x-death"] = [{"reason": HOSTILE_VALUES[index % len(HOSTILE_VALUES)], "time": -5}]
    return headers


def _raw_messages(body: bytes, prefix: str) -> list[RawMessage]:
    """Frames no well-behaved client sends: not UTF-8, and a timestamp past 9999."""
    return [
        RawMessage(
            body,
            commands.Basic.Properties(message_id=f"{prefix}MIDXX", delivery_mode=2),
            replace_bytes(f"{prefix}MIDXX".encode(), f"{prefix}M".encode() + b"\xff\x00\xfeX"),
        ),
        RawMessage(
            body,
            commands.Basic.Properties(message_id=f"{prefix}ts", timestamp=WHEN, delivery_mode=2),
            replace_bytes(WHEN_BYTES, FAR),
        ),
        RawMessage(
            body,
            commands.Basic.Properties(
                message_id=f"{prefix}key", headers={"KEYXX": 1}, delivery_mode=2
            ),
            replace_bytes(b"KEYXX", b"K\xff\xfeXX"),
        ),
        RawMessage(
            body,
            commands.Basic.Properties(
                message_id=f"{prefix}hts", headers={"x-expiry-first-seen": WHEN}, delivery_mode=2
            ),
            replace_bytes(WHEN_BYTES, FAR_MS),
        ),
    ]


async def _publish(
    stack: support.Stack, exchange: str, routing_key: str, messages: list[aio_pika.Message]
) -> None:
    connection = await aio_pika.connect(stack.amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        target = await channel.get_exchange(exchange)
        for message in messages:
            await target.publish(message, routing_key, mandatory=True)
    finally:
        await connection.close()


def _message(body: bytes, message_id: str | None, headers: dict[str, Any]) -> aio_pika.Message:
    return aio_pika.Message(
        body,
        message_id=message_id,
        headers=headers,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        timestamp=WHEN,
    )


async def _records(stack: support.Stack) -> list[dict[str, Any]]:
    async with support.pg_connection(stack.database_url) as conn:
        return [dict(row) for row in await conn.fetch("SELECT * FROM dead_letters")]


async def _count_is(stack: support.Stack, count: int) -> bool:
    return len(await _records(stack)) >= count


async def _settled(stack: support.Stack, *queues: str) -> None:
    """With no consumer left, nothing came back: every delivery was settled."""
    for queue in queues:
        assert await support.queue_depth(stack.amqp_url, queue) == 0, queue


def _assert_storable(record: dict[str, Any]) -> None:
    for name in ("message_id", "error_class", "give_up", "reason", "worker", "body_excerpt"):
        value = record[name]
        assert value is None or value.isprintable(), (name, value)
    assert 1 <= record["attempts"] <= 1000
    assert record["first_seen"] <= record["last_seen"]
    now = datetime.datetime.now(datetime.UTC)
    assert now - datetime.timedelta(days=367) < record["first_seen"] <= now


async def test_the_issue_reproduction_now_settles_and_records(stack: support.Stack) -> None:
    """The issue's headers on a command, on poison, and on a dead letter: all settled,
    the command expired once, both dead letters recorded with sane attempts and times."""
    [rid] = await support.insert_holds(stack.database_url, 1)
    good = command_body(rid, datetime.datetime.now(datetime.UTC))
    async with support.attached_consumer(stack) as task:
        await _publish(
            stack,
            "expirations",
            "expire",
            [
                _message(good, f"issue-good-{rid}", ISSUE_HEADERS),
                _message(b"\x00poison", "issue-poison", ISSUE_HEADERS),
            ],
        )
        forged = {**ISSUE_HEADERS, "x-expiry-give-up": "attempts-exhausted"}
        await _publish(stack, "expirations.dead", "dead", [_message(b"\x00", "issue-dead", forged)])
        await support.eventually(lambda: _count_is(stack, 2), timeout=30)
        assert not task.done()
    await _settled(stack, "expirations", "expirations.dead.log")
    assert await support.statuses(stack.database_url) == {"expired": 1}
    assert set((await support.transitions_per_reservation(stack.database_url)).values()) == {1}
    records = {r["message_id"]: r for r in await _records(stack)}
    assert set(records) == {"issue-poison", "issue-dead"}
    for record in records.values():
        _assert_storable(record)
        assert record["attempts"] == 1
    assert records["issue-poison"]["body_excerpt"] == "?xxxxxx (7 bytes)"


async def test_hostile_messages_to_the_work_queue_are_settled(stack: support.Stack) -> None:
    """Valid commands with hostile headers expire once; poison in every shape, and raw
    frames that are not UTF-8 or hold far timestamps, are dead-lettered and recorded;
    the consumer stays up and its ordinary work expires exactly once."""
    hostile_ids = await support.insert_holds(stack.database_url, len(HOSTILE_VALUES))
    now = datetime.datetime.now(datetime.UTC)
    commands_ = [
        _message(command_body(rid, now), f"hostile-{i}\x00\x1b", _hostile_headers(i))
        for i, rid in enumerate(hostile_ids)
    ]
    poison = [
        _message(body, None if i % 2 else f"poison-{i}", _hostile_headers(i))
        for i, body in enumerate(POISON_BODIES)
    ]
    unknown = [_message(command_body(uuid.uuid4(), now), "unknown-1", _hostile_headers(3))]
    raw = _raw_messages(b"\x00raw poison", "w")
    ordinary = await support.insert_holds(stack.database_url, 200)
    async with support.attached_consumer(stack) as task:
        await _publish(stack, "expirations", "expire", commands_ + poison + unknown)
        await publish_raw_frames(stack.amqp_url, "expirations", "expire", raw)
        await scan.scan_once(stack.settings)
        expected_dead = len(poison) + len(unknown) + len(raw)
        await support.eventually(lambda: _count_is(stack, expected_dead), timeout=60)
        await support.eventually(lambda: _all_expired(stack, len(hostile_ids) + len(ordinary)))
        assert not task.done()
    await _settled(stack, "expirations", "expirations.dead.log")
    assert set((await support.transitions_per_reservation(stack.database_url)).values()) == {1}
    records = await _records(stack)
    assert len(records) == expected_dead
    assert await support.queue_depth(stack.amqp_url, "expirations.dead") == expected_dead
    for record in records:
        _assert_storable(record)
    classes = {r["error_class"] for r in records}
    assert classes <= {"poison.not-json", "poison.schema", "poison.bad-uuid", "unknown-reservation"}


async def _all_expired(stack: support.Stack, count: int) -> bool:
    return (await support.statuses(stack.database_url)).get("expired", 0) == count


async def test_hostile_dead_letters_are_all_recorded(stack: support.Stack) -> None:
    """Whatever reaches the dead-letter log (forged verdicts, forged x-death of every type,
    raw frames) becomes a storable record, and the log queue drains."""
    forged = [
        _message(body, f"dead-{i}" if i % 3 else None, {**_hostile_headers(i), **extra})
        for i, (body, extra) in enumerate(
            (body, extra)
            for body in (b"\x00", b"[" * 20000, command_body(uuid.uuid4(), WHEN))
            for extra in (
                {"x-expiry-give-up": "\x00" * 300},
                {"x-expiry-give-up": None},
                {"x-expiry-give-up": {"t": 1}},
                {},
            )
        )
    ]
    raw = _raw_messages(b"\x00", "d")
    async with support.attached_consumer(stack) as task:
        await _publish(stack, "expirations.dead", "expirations.dead.log", forged)
        await publish_raw_frames(stack.amqp_url, "expirations.dead", "dead", raw)
        await support.eventually(lambda: _count_is(stack, len(forged) + len(raw)), timeout=60)
        assert not task.done()
    await _settled(stack, "expirations.dead.log")
    records = await _records(stack)
    assert len(records) == len(forged) + len(raw)
    for record in records:
        _assert_storable(record)
    assert await support.queue_depth(stack.amqp_url, "expirations.dead") == len(raw)


async def test_hostile_messages_in_the_dead_queue_survive_a_replay(stack: support.Stack) -> None:
    """A replay takes every message of expirations.dead: hostile ones it does not replay
    are given back, none lost, and the replay itself goes through."""
    forged = [_message(b"\x00", f"kept-{i}", _hostile_headers(i)) for i in range(5)]
    raw = _raw_messages(b"\x00", "r")
    async with support.attached_consumer(stack):
        await _publish(stack, "expirations", "expire", [_message(b"junk", "junk-1", {})])
        await support.eventually(lambda: _count_is(stack, 1), timeout=30)
    await _publish(stack, "expirations.dead", "expirations.dead", forged)
    await publish_raw_frames(stack.amqp_url, "expirations.dead", "expirations.dead", raw)
    results = await _replay(stack, "junk-1")
    assert results == 0
    assert await support.queue_depth(stack.amqp_url, "expirations.dead") == len(forged) + len(raw)
    assert await support.queue_depth(stack.amqp_url, "expirations") == 1  # junk-1, replayed


async def _replay(stack: support.Stack, key: str) -> int:
    args = deadletters.build_parser().parse_args(["replay", key, "--operator", "test"])
    settings = stack.settings.model_copy(update={"replay_operators": ("test",)})
    return await deadletters.replay_command(settings, args)


async def test_a_refused_copy_ends_in_the_dead_letters_not_in_a_loop(
    stack: support.Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """While every retry copy is refused (unroutable), a failing command comes back
    REFUSAL_LIMIT times, then the consumer rejects it and the broker dead-letters it:
    recorded, never lost, and never handled again."""
    caplog.set_level(logging.INFO)
    [rid] = await support.insert_holds(stack.database_url, 1)
    async with (
        database_behind_proxy(stack) as database,
        consumer_cut_off(stack, database, scan=False),
    ):
        await _unbind_retry_tiers(stack, database.settings)
        # Published as the scan would, without the scan's declarations (which bind).
        body = command_body(rid, datetime.datetime.now(datetime.UTC))
        await _publish(stack, "expirations", "expire", [_message(body, f"expire:{rid}", {})])
        await support.eventually(lambda: _depth(stack, "expirations.dead", 1), timeout=90)
        database.proxy.restore()
        await support.eventually(lambda: _count_is(stack, 1), timeout=60)
    refused = [r for r in caplog.records if r.msg == "expiry.copy_failed"]
    assert len(refused) == REFUSAL_LIMIT
    assert getattr(refused[-1], "final", False) is True
    [record] = await _records(stack)
    assert (record["error_class"], record["give_up"]) == ("rejected", "rejected")
    assert record["reservation_id"] == rid
    assert await support.statuses(stack.database_url) == {"held": 1}
    await _settled(stack, "expirations", "expirations.dead.log")


async def _unbind_retry_tiers(stack: support.Stack, settings: Settings) -> None:
    """Every retry copy is now unroutable, so the broker returns it (a refusal)."""
    connection = await aio_pika.connect(stack.amqp_url)
    try:
        channel = await connection.channel()
        for spec in topology_for(settings).delay_queues:
            queue = await channel.get_queue(spec.name)
            await queue.unbind(spec.exchange, spec.routing_key)
    finally:
        await connection.close()


async def _depth(stack: support.Stack, queue: str, depth: int) -> bool:
    return await support.queue_depth(stack.amqp_url, queue) == depth


async def test_a_dead_letter_returned_often_is_refreshed_not_dropped(stack: support.Stack) -> None:
    """A dead letter returned half its queue's delivery limit times (many replays of
    others) is replaced by a fresh copy when given back, in that queue alone."""
    async with support.attached_consumer(stack):
        await _publish(stack, "expirations", "expire", [_message(b"junk", "junk-1", {})])
        await support.eventually(lambda: _count_is(stack, 1), timeout=30)
    await _publish(stack, "expirations.dead", "expirations.dead", [_message(b"old", "old-1", {})])
    await _return_many_times(stack, "old-1", REFRESH_AT)
    assert await _replay(stack, "junk-1") == 0
    kept = await _peek_all(stack, "expirations.dead")
    old = [m for m in kept if m.message_id == "old-1"]
    assert len(old) == 1
    assert (old[0].headers or {}).get("x-delivery-count", 0) == 0
    assert not old[0].redelivered
    assert await support.queue_depth(stack.amqp_url, "expirations.dead.log") == 0
    assert len(await _records(stack)) == 1  # the fresh copy went to expirations.dead alone


async def _return_many_times(stack: support.Stack, message_id: str, times: int) -> None:
    """Take and reject the message ``times`` times, as that many replays of others would."""
    connection = await aio_pika.connect(stack.amqp_url)
    try:
        channel = await connection.channel()
        queue = await channel.get_queue("expirations.dead")
        returned = 0
        async with asyncio.timeout(120):
            while returned < times:
                message = await queue.get(no_ack=False, fail=False)
                if message is None:
                    await asyncio.sleep(0.01)
                    continue
                if message.message_id == message_id:
                    returned += 1
                await message.reject(requeue=True)
    finally:
        await connection.close()


async def _peek_all(
    stack: support.Stack, queue_name: str
) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """Every message of a queue, taken and returned once (through a closed channel)."""
    connection = await aio_pika.connect(stack.amqp_url)
    try:
        channel = await connection.channel()
        queue = await channel.get_queue(queue_name)
        messages = []
        while (message := await queue.get(no_ack=False, fail=False)) is not None:
            messages.append(message)
        return messages
    finally:
        await connection.close()


async def test_an_unexpected_failure_still_settles_and_records(
    stack: support.Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug anywhere in a delivery's handling (here: reading its headers, and publishing
    its dead-letter copy) never leaves it unsettled: it is handled as a first attempt, or
    rejected so that the broker dead-letters it, and then recorded."""
    from service.worker import delivery, failures

    def broken_read(*_args: object) -> delivery.Attempt:
        raise RuntimeError("a bug in read_attempt")

    async def broken_copy(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("a bug in publish_copy")

    monkeypatch.setattr(delivery, "read_attempt", broken_read)
    monkeypatch.setattr(failures.Failures, "_publish_copy", broken_copy)
    [rid] = await support.insert_holds(stack.database_url, 1)
    now = datetime.datetime.now(datetime.UTC)
    async with support.attached_consumer(stack) as task:
        await _publish(
            stack,
            "expirations",
            "expire",
            [_message(command_body(rid, now), "bug-good", {}), _message(b"junk", "bug-junk", {})],
        )
        await support.eventually(lambda: _count_is(stack, 1), timeout=30)
        await support.eventually(lambda: _all_expired(stack, 1))
        assert not task.done()
    await _settled(stack, "expirations", "expirations.dead.log")
    [record] = await _records(stack)
    assert (record["message_id"], record["error_class"]) == ("bug-junk", "rejected")


async def test_a_record_the_database_refuses_is_stored_reduced(stack: support.Stack) -> None:
    """When PostgreSQL refuses a record's values (here a constraint refuses every
    excerpt), the recorder stores it without them, saying why, instead of looping."""
    async with support.pg_connection(stack.database_url) as conn:
        await conn.execute(
            "ALTER TABLE dead_letters ADD CONSTRAINT no_excerpts CHECK (body_excerpt IS NULL)"
        )
    async with support.attached_consumer(stack):
        await _publish(stack, "expirations", "expire", [_message(b"junk", "refused-1", {})])
        await support.eventually(lambda: _count_is(stack, 1), timeout=30)
    await _settled(stack, "expirations", "expirations.dead.log")
    [record] = await _records(stack)
    assert record["message_id"] == "refused-1"
    assert record["body_excerpt"] is None
    assert record["reason"].startswith("record reduced (CheckViolationError)")
    assert record["error_class"] == "poison.not-json"
