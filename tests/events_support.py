"""What the tests of the events share: a reader's queue bound to ``expiry.events``, a relay
running in-process (``service.relay.run``, stopped as SIGTERM would), the events a reader
received, and the outbox's rows."""

from __future__ import annotations

import asyncio
import json
import uuid
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from service.core.domain import epoch_millis
from service.core.topology import EVENT_ROUTING_KEY, EVENTS_EXCHANGE
from service.relay import Pump, run
from service.settings import Settings
from tests.support import Stack, eventually, pg_connection, running_until_stopped


@dataclass(frozen=True)
class Received:
    """One event as a reader's queue gave it."""

    message_id: str
    body: dict[str, Any]
    routing_key: str | None
    content_type: str | None
    delivery_mode: int | None
    message_type: str | None
    headers: dict[str, Any]


def expected_message_id(reservation_id: uuid.UUID, hold_until: datetime) -> str:
    """The contract's message id of the event of this hold."""
    return f"expired:{reservation_id}:{epoch_millis(hold_until)}"


async def bind_reader_queue(amqp_url: str, name: str | None = None) -> str:
    """A reader's own durable queue, bound to the events exchange for expiries; its name."""
    name = name or f"reader-{uuid.uuid4().hex[:8]}"
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        exchange = await channel.get_exchange(EVENTS_EXCHANGE)
        queue = await channel.declare_queue(name, durable=True)
        await queue.bind(exchange, EVENT_ROUTING_KEY)
    return name


async def take_events(amqp_url: str, queue: str) -> list[Received]:
    """Every event waiting in ``queue`` (taken and acked), in queue order."""
    taken: list[Received] = []
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        source = await channel.get_queue(queue)
        while (message := await source.get(fail=False, timeout=5)) is not None:
            taken.append(_received(message))
            await message.ack()
    return taken


def _received(message: AbstractIncomingMessage) -> Received:
    return Received(
        message_id=str(message.message_id),
        body=json.loads(message.body),
        routing_key=message.routing_key,
        content_type=message.content_type,
        delivery_mode=int(message.delivery_mode) if message.delivery_mode else None,
        message_type=message.type,
        headers=dict(message.headers or {}),
    )


async def collect_events(
    amqp_url: str, queue: str, count: int, timeout: float = 60
) -> list[Received]:
    """Take events from ``queue`` until ``count`` arrived (fail after ``timeout``)."""
    got: list[Received] = []

    async def enough() -> bool:
        got.extend(await take_events(amqp_url, queue))
        return len(got) >= count

    await eventually(enough, timeout=timeout, every=0.2)
    return got


def running_relay(settings: Settings) -> AbstractAsyncContextManager[asyncio.Task[Pump]]:
    """An in-process relay (the real ``run``), stopped as SIGTERM would on leaving."""
    return running_until_stopped(lambda stop: run(settings, stop))


INSERT_EVENTS = """
INSERT INTO expiry_events (reservation_id, hold_until, expired_at, message_id, traceparent)
SELECT id, hold_until, now(),
       'expired:' || id || ':' || round(extract(epoch FROM hold_until) * 1000)::bigint, $2
  FROM (SELECT gen_random_uuid() AS id, date_trunc('milliseconds', now()) AS hold_until
          FROM generate_series(1, $1)) AS made
RETURNING message_id
"""


async def insert_events(stack: Stack, count: int, *, traceparent: str | None = None) -> list[str]:
    """``count`` pending events (of holds that do not exist: the relay reads the outbox
    alone), as the trigger writes them; their message ids."""
    async with pg_connection(stack.database_url) as conn:
        rows = await conn.fetch(INSERT_EVENTS, count, traceparent)
    return [row["message_id"] for row in rows]


@dataclass(frozen=True)
class Outbox:
    """The outbox's rows: pending (with their claims) and sent."""

    pending: dict[str, int]  # message id -> claims
    leased: int  # pending rows whose lease still holds
    sent: dict[str, int]  # message id -> claims when it was marked


async def outbox(stack: Stack) -> Outbox:
    """The outbox as it stands."""
    async with pg_connection(stack.database_url) as conn:
        pending = await conn.fetch("SELECT message_id, claims FROM expiry_events")
        leased = await conn.fetchval(
            "SELECT count(*) FROM expiry_events WHERE lease_until >= now()"
        )
        sent = await conn.fetch("SELECT message_id, claims FROM expiry_events_sent")
    return Outbox(
        {row["message_id"]: row["claims"] for row in pending},
        leased,
        {row["message_id"]: row["claims"] for row in sent},
    )


async def all_sent(stack: Stack, count: int) -> bool:
    """``count`` events sent and none pending."""
    state = await outbox(stack)
    return not state.pending and len(state.sent) == count
