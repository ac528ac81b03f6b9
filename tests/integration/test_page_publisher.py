"""A page of commands on a real broker: one write, each command confirmed or refused alone,
and the channel's delivery tags still in step for whatever it publishes next."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel

from service.adapters import amqp
from service.adapters.amqp import messages, page_publisher
from service.adapters.amqp.page_publisher import Command, PagePublisher
from service.core.domain import command_body, message_id
from service.core.errors import PublishNotConfirmed
from service.core.topology import EXCHANGE, QUEUE, ROUTING_KEY
from tests.support import Stack, drain_queue, queue_depth

pytestmark = pytest.mark.integration


def commands(count: int) -> list[Command]:
    now = datetime.now(UTC)
    ids = [uuid.uuid4() for _ in range(count)]
    return [Command(command_body(rid, now), message_id(rid, now)) for rid in ids]


@pytest.fixture
async def channel(stack: Stack) -> AsyncIterator[AbstractChannel]:
    """A confirm channel, as the scan opens it."""
    connection = await aio_pika.connect_robust(stack.amqp_url)
    try:
        yield await amqp.open_confirm_channel(connection)
    finally:
        await connection.close()


@pytest.mark.parametrize("one_by_one", [False, True], ids=["page", "one-by-one"])
async def test_a_page_is_confirmed_command_by_command_in_the_contract_format(
    stack: Stack, channel: AbstractChannel, monkeypatch: pytest.MonkeyPatch, one_by_one: bool
) -> None:
    """Every command confirmed, queued in order, persistent JSON with its stable id; the
    same where the channel takes no pages (``basic_publish`` one by one)."""
    if one_by_one:
        monkeypatch.setattr(page_publisher, "supports_pages", lambda _channel: False)
    else:  # the aiormq of the lock takes pages: this is the path the scan takes
        assert page_publisher.supports_pages(await channel.get_underlay_channel())
    page = commands(300)
    outcomes = await PagePublisher(channel, EXCHANGE, ROUTING_KEY).publish(page, timeout=10)
    assert outcomes == [None] * len(page)
    queued = await drain_queue(stack.amqp_url, QUEUE)
    assert [m.message_id for m in queued] == [c.message_id for c in page]
    assert [m.body for m in queued] == [c.body for c in page]
    for message in queued:
        assert message.content_type == "application/json"
        assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
        assert (message.type, message.app_id) == (messages.COMMAND_TYPE, messages.APP_ID)


async def test_unroutable_commands_are_refused_each_and_the_tags_stay_in_step(
    stack: Stack, channel: AbstractChannel
) -> None:
    """A page to a routing key with no queue: each command comes back returned; then a
    routable page, and a publish of aio-pika's own, are confirmed on the same channel
    (the delivery tags the page took are the broker's too)."""
    lost = commands(50)
    outcomes = await PagePublisher(channel, EXCHANGE, "nowhere").publish(lost, timeout=10)
    assert all(o is not None and o.startswith("unroutable") for o in outcomes), outcomes
    kept = commands(20)
    outcomes = await PagePublisher(channel, EXCHANGE, ROUTING_KEY).publish(kept, timeout=10)
    assert outcomes == [None] * len(kept)
    exchange = await channel.get_exchange(EXCHANGE, ensure=False)
    extra = messages.command(b"{}", "one-more")
    await amqp.publish_confirmed(exchange, extra, ROUTING_KEY, timeout=10)
    with pytest.raises(PublishNotConfirmed, match="unroutable"):
        await amqp.publish_confirmed(exchange, extra, "nowhere", timeout=10)
    assert await queue_depth(stack.amqp_url, QUEUE) == len(kept) + 1


async def test_a_closed_channel_refuses_the_page_with_a_reason(
    stack: Stack, channel: AbstractChannel
) -> None:
    """The channel closed by the broker under the page (a publish to an exchange that does
    not exist): every command is refused with why, none raises; nothing is queued."""
    outcomes = await PagePublisher(channel, "no-such-exchange", ROUTING_KEY).publish(
        commands(10), timeout=10
    )
    assert all(o is not None and o.startswith("channel lost") for o in outcomes), outcomes
    assert await queue_depth(stack.amqp_url, QUEUE) == 0
