"""A delivery read from aiormq's message: what the consumer reads of it, how it settles."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import aiormq.abc
import aiormq.exceptions
import pytest
from pamqp import commands as spec
from pamqp.header import ContentHeader

from service.adapters.amqp.consuming import FrameMessage
from service.adapters.amqp.messages import copy_of


@dataclass
class FakeChannel:
    """The two settling calls of an aiormq channel, recorded."""

    is_closed: bool = False
    sent: list[tuple[str, int, bool]] = field(default_factory=list)

    async def basic_ack(self, delivery_tag: int, multiple: bool = False) -> None:
        self.sent.append(("ack", delivery_tag, multiple))

    async def basic_reject(self, delivery_tag: int, requeue: bool = True) -> None:
        self.sent.append(("reject", delivery_tag, requeue))


WHEN = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def delivered(channel: FakeChannel, **properties: Any) -> FrameMessage:
    frame = spec.Basic.Deliver(
        consumer_tag="ctag",
        delivery_tag=7,
        redelivered=True,
        exchange="expirations",
        routing_key="expire",
    )
    header = ContentHeader(body_size=2, properties=spec.Basic.Properties(**properties))
    message = aiormq.abc.DeliveredMessage(
        delivery=frame, header=header, body=b"{}", channel=cast(Any, channel)
    )
    return FrameMessage(message)


def test_a_delivery_reads_its_frame_and_properties() -> None:
    """Tag, redelivery, exchange and routing key from the deliver frame; the rest from
    its properties, with no value made up where none was sent."""
    message = delivered(
        FakeChannel(),
        message_id="m-1",
        headers={"x": 1},
        content_type="application/json",
        correlation_id="c",
        timestamp=WHEN,
        message_type="expire",
        app_id="app",
    )
    assert (message.delivery_tag, message.redelivered) == (7, True)
    assert (message.exchange, message.routing_key, message.body) == ("expirations", "expire", b"{}")
    assert (message.message_id, message.headers, message.timestamp) == ("m-1", {"x": 1}, WHEN)
    assert (message.type, message.app_id, message.correlation_id) == ("expire", "app", "c")
    assert message.content_encoding is None
    bare = delivered(FakeChannel())
    assert (bare.message_id, bare.headers, bare.timestamp, bare.type) == (None, None, None, None)


async def test_it_settles_on_its_own_channel() -> None:
    """ack and reject go to the channel it came on, with its tag."""
    channel = FakeChannel()
    message = delivered(channel)
    await message.ack()
    await message.reject(requeue=False)
    await message.reject(requeue=True)
    assert channel.sent == [("ack", 7, False), ("reject", 7, False), ("reject", 7, True)]


async def test_once_its_channel_is_closed_its_tag_is_void() -> None:
    """A closed channel: reading it or settling raises ChannelInvalidStateError, and
    nothing is sent (the broker redelivers the message)."""
    channel = FakeChannel(is_closed=True)
    message = delivered(channel)
    with pytest.raises(aiormq.exceptions.ChannelInvalidStateError):
        _ = message.channel
    with pytest.raises(aiormq.exceptions.ChannelInvalidStateError):
        await message.ack()
    assert channel.sent == []


def test_a_copy_keeps_its_properties_and_takes_new_headers() -> None:
    """A retry or dead-letter copy of a delivery read from aiormq."""
    message = delivered(
        FakeChannel(), message_id="m-1", headers={"old": 1}, timestamp=WHEN, app_id="app"
    )
    copy = copy_of(message, {"new": 2})
    assert (copy.body, copy.message_id, copy.app_id, copy.headers) == (
        b"{}",
        "m-1",
        "app",
        {"new": 2},
    )
    assert copy.timestamp == WHEN
