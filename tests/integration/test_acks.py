"""Coalesced acks against the real broker: a multiple-ack never covers a delivery
still being handled, and contiguous acks go out as one frame."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import aiormq.exceptions
import pytest
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from service.worker.acks import Acker
from tests.support import Stack, eventually, queue_depth

pytestmark = pytest.mark.integration

QUEUE = "acks-test"
COUNT = 10


@pytest.fixture
async def channel(stack: Stack) -> AsyncIterator[AbstractChannel]:
    connection = await aio_pika.connect(stack.amqp_url)
    try:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=COUNT)
        queue = await channel.declare_queue(
            QUEUE, durable=True, arguments={"x-queue-type": "quorum"}
        )
        for number in range(1, COUNT + 1):
            await channel.default_exchange.publish(aio_pika.Message(str(number).encode()), QUEUE)
        await eventually(lambda: _ready_is(stack, COUNT))
        _ = queue
        yield channel
    finally:
        await connection.close()


async def _ready_is(stack: Stack, count: int) -> bool:
    return await queue_depth(stack.amqp_url, QUEUE) == count


async def _deliveries(channel: AbstractChannel) -> list[AbstractIncomingMessage]:
    """All COUNT deliveries, in delivery-tag order, none settled."""
    got: list[AbstractIncomingMessage] = []
    queue = await channel.get_queue(QUEUE)

    async def take(message: AbstractIncomingMessage) -> None:
        got.append(message)

    await queue.consume(take)
    async with asyncio.timeout(10):
        while len(got) < COUNT:
            await asyncio.sleep(0.01)
    return sorted(got, key=lambda message: message.delivery_tag or 0)


def _record_ack_frames(message: AbstractIncomingMessage) -> list[tuple[int, bool]]:
    """Wrap the channel's basic_ack to see the frames the Acker sends."""
    frames: list[tuple[int, bool]] = []
    underlying: Any = message.channel
    original = underlying.basic_ack

    async def recording(delivery_tag: int, multiple: bool = False, wait: bool = True) -> None:
        frames.append((delivery_tag, multiple))
        await original(delivery_tag=delivery_tag, multiple=multiple, wait=wait)

    underlying.basic_ack = recording
    return frames


async def test_a_delivery_still_handled_is_never_acked_by_its_neighbours(
    stack: Stack, channel: AbstractChannel
) -> None:
    """Tag 4 is held; 1-3 go as one multiple-ack, 5-10 alone once stuck; 4 comes back."""
    deliveries = await _deliveries(channel)
    frames = _record_ack_frames(deliveries[0])
    acker = Acker(stuck_after=0.2)
    held = deliveries[3]
    others = [message for message in deliveries if message is not held]
    await asyncio.gather(*(acker.ack(message) for message in others))

    assert frames[0] == (3, True)
    assert sorted(frames[1:]) == [(tag, False) for tag in range(5, COUNT + 1)]
    await channel.close()  # the held delivery was never acked: the broker requeues it
    await eventually(lambda: _ready_is(stack, 1))
    redelivered = await _take_one(stack)
    assert redelivered == b"4"


async def test_the_floor_passes_tags_settled_alone_and_acks_what_waited(
    stack: Stack, channel: AbstractChannel
) -> None:
    """5 is nacked back alone, then the rest: one ack frame names 10, and only 5 returns."""
    deliveries = await _deliveries(channel)
    frames = _record_ack_frames(deliveries[0])
    acker = Acker(stuck_after=30)  # never: everything must go through the floor
    nacked = deliveries[4]
    await nacked.nack(requeue=False)  # settled alone (as a retry copy's original is)
    acker.settled(nacked)
    await asyncio.gather(*(acker.ack(m) for m in deliveries if m is not nacked))

    assert frames == [(COUNT, True)]
    await channel.close()
    assert await queue_depth(stack.amqp_url, QUEUE) == 0  # all acked, 5 dropped by its nack


async def test_an_ack_on_a_closed_channel_says_so(stack: Stack, channel: AbstractChannel) -> None:
    """Like message.ack(): ChannelInvalidStateError, so the caller logs a stale delivery."""
    deliveries = await _deliveries(channel)
    await channel.close()
    acker = Acker()
    with pytest.raises(aiormq.exceptions.ChannelInvalidStateError):
        await acker.ack(deliveries[0])
    told: list[BaseException | None] = []
    acker.ack_soon(deliveries[1], told.append)
    assert len(told) == 1
    assert isinstance(told[0], aiormq.exceptions.ChannelInvalidStateError)
    await eventually(lambda: _ready_is(stack, COUNT))


async def _take_one(stack: Stack) -> bytes:
    connection = await aio_pika.connect(stack.amqp_url)
    try:
        channel = await connection.channel()
        queue = await channel.get_queue(QUEUE)
        message = await queue.get(timeout=5)
        await message.ack()
        return message.body
    finally:
        await connection.close()
