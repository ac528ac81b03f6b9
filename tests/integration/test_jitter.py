"""Jittered retries against the real broker: the slot queues a deploy declares, and copies
that failed together coming back spread over their tier's window, none past its bound.

The burst goes through the consumer's own failure handling (``Failures``: the retry
decision with its random draw, the confirmed publish to the chosen slot's routing key) with
the consumer's own publisher; the test notes when each failure's handling returned (its
copy confirmed, the delivery acked) and reads the slot chosen from the consumer's log line.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from service.adapters import amqp
from service.adapters.amqp.declaring import check_topology, topology_for
from service.adapters.amqp.messages import command_for
from service.adapters.telemetry.metrics import Metrics
from service.core import topology
from service.core.dead_letter import ATTEMPT_HEADER
from service.declare import declare
from service.settings import Settings
from service.worker.acks import AckAlone
from service.worker.delivery import Delivery
from service.worker.failures import Failures
from service.worker.ports import AmqpPublisher
from service.worker.reporting import Reporter
from tests.integration.definitions_support import BrokerAdmin
from tests.support import Stack

pytestmark = pytest.mark.integration

BURST = 200
# What the broker may add to a TTL before the message is back: RabbitMQ 3.10 and 4.0 were
# measured within a few tens of milliseconds (python -m bench.jitter); this leaves room
# for a loaded test machine.
TIMER_SLACK_SECONDS = 1.0
TIMEOUT_SECONDS = 30.0
DEFAULTS: dict[str, object] = {
    name: Settings.model_fields[name].default
    for name in ("retry_delays", "retry_jitter", "retry_jitter_slots")
}


@dataclass(frozen=True)
class Back:
    """A copy back in ``expirations``."""

    at: float
    attempt: object
    died_in: object  # the queue its x-death names


@pytest.fixture
async def jittered(bare_stack: Stack) -> Stack:
    """Tiers of 1 and 2 s, jitter 0.5 over 4 slots, declared as the deploy does."""
    stack = bare_stack.with_settings(retry_jitter=0.5, retry_jitter_slots=4)
    await declare(stack.settings)
    return stack


async def _held(channel: AbstractChannel, count: int) -> list[AbstractIncomingMessage]:
    """``count`` commands published and taken from ``expirations``, unacked."""
    exchange = await channel.get_exchange(topology.EXCHANGE, ensure=False)
    now = datetime.now(UTC)
    for _ in range(count):
        command = command_for(uuid.uuid4(), now)
        await amqp.publish_confirmed(exchange, command, topology.ROUTING_KEY, timeout=10)
    await channel.set_qos(prefetch_count=count)
    queue = await channel.get_queue(topology.QUEUE, ensure=False)
    held: list[AbstractIncomingMessage] = []
    async with queue.iterator() as deliveries:
        async for message in deliveries:
            held.append(message)
            if len(held) == count:
                break
    return held


async def _watch(channel: AbstractChannel, back: dict[str, Back], count: int) -> asyncio.Event:
    """Note every message that arrives in ``expirations``; the event is set at ``count``."""
    done = asyncio.Event()

    async def arrived(message: AbstractIncomingMessage) -> None:
        deaths = message.headers.get("x-death")
        first = deaths[0] if isinstance(deaths, list) and deaths else None
        died_in = first.get("queue") if isinstance(first, dict) else None
        back[message.message_id or ""] = Back(
            time.monotonic(), message.headers.get(ATTEMPT_HEADER), died_in
        )
        if len(back) >= count:
            done.set()

    await (await channel.get_queue(topology.QUEUE, ensure=False)).consume(arrived, no_ack=True)
    return done


async def _fail(
    failures: Failures, message: AbstractIncomingMessage, handled: dict[str, float]
) -> None:
    """Fail one delivery through the consumer's failure handling; note when that returned
    (after its copy was confirmed: the copy was in its delay queue by then)."""
    await failures.handle(Delivery.of(message, None), ConnectionRefusedError())
    handled[message.message_id or ""] = time.monotonic()


async def test_copies_that_failed_together_come_back_spread_and_within_their_bound(
    jittered: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """A burst of commands failing at once on their first attempt: each copy waits in the
    slot queue it was sent to (its x-death says so) for at least that slot's delay and is
    back within the tier's bound (1 s, plus the broker's timer slack); the four slots are
    all used; each log line tells its delay and bound."""
    caplog.set_level(logging.INFO, logger="service.consume")
    settings = jittered.settings
    slots = topology.slot_delays_ms(1, 0.5, 4)
    connection = await aio_pika.connect(jittered.amqp_url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        held = await _held(channel, BURST)
        publisher = AmqpPublisher(
            await channel.get_exchange(topology.RETRY_EXCHANGE, ensure=False),
            await channel.get_exchange(topology.DEAD_EXCHANGE, ensure=False),
            TIMEOUT_SECONDS,
        )
        failures = Failures(settings, publisher, AckAlone(), Reporter(Metrics()))
        back: dict[str, Back] = {}
        all_back = await _watch(await connection.channel(), back, BURST)
        handled: dict[str, float] = {}
        failed_at = time.monotonic()
        await asyncio.gather(*(_fail(failures, m, handled) for m in held))
        async with asyncio.timeout(TIMEOUT_SECONDS):
            await all_back.wait()
    logged = [r for r in caplog.records if r.msg == "expiry.retry"]
    assert len(logged) == BURST
    slot_of: dict[str, int] = {}
    for record in logged:
        assert record.bound_s == 1  # type: ignore[attr-defined]
        slot_of[record.message_id] = round(record.delay_s * 1000)  # type: ignore[attr-defined]
    assert set(back) == set(handled) == set(slot_of) == {m.message_id for m in held}
    for message_id, delay_ms in slot_of.items():
        copy = back[message_id]
        assert delay_ms in slots
        assert (copy.attempt, copy.died_in) == (2, topology.delay_queue(delay_ms))
        assert copy.at - failed_at >= delay_ms / 1000
        assert copy.at - handled[message_id] <= 1 + TIMER_SLACK_SECONDS
    assert set(slot_of.values()) == set(slots)


async def test_the_default_topology_is_declared_and_checked_with_every_slot(
    bare_stack: Stack,
) -> None:
    """With the default settings the deploy declares eight slot queues per tier, each bound
    by its own key with its own TTL; the running processes accept it, and so does one
    configured without jitter (a rolling deploy: the tiers' own queues are still there)."""
    stack = bare_stack.with_settings(**DEFAULTS)
    await declare(stack.settings)
    expected = topology.definitions(topology_for(stack.settings))
    admin = BrokerAdmin.like(stack.management)
    assert await admin.queue_arguments(stack.vhost) == {
        q["name"]: q["arguments"] for q in expected["queues"]
    }
    assert await admin.bindings(stack.vhost) == {
        (b["source"], b["destination"], b["routing_key"]) for b in expected["bindings"]
    }
    assert len(topology_for(stack.settings).delay_queues) == 32
    for settings in (stack.settings, stack.settings.model_copy(update={"retry_jitter": 0.0})):
        connection = await amqp.connect(settings, name="test-check")
        try:
            await check_topology(connection, settings)
        finally:
            await connection.close()
