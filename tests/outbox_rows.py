"""The outbox as the tests of its writers read it (migration 0014_events): every event
row, pending or sent; the notifications a LISTENing connection receives; commands
published each with its own headers."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

import aio_pika
import asyncpg

from service.adapters.postgres.outbox import CHANNEL
from tests.support import pg_connection

EVENT_ROWS = """
SELECT e.reservation_id, e.message_id, e.hold_until, e.expired_at, e.traceparent,
       false AS sent
  FROM expiry_events e
UNION ALL
SELECT s.reservation_id, s.message_id, NULL, s.expired_at, NULL, true FROM expiry_events_sent s
"""


@dataclass(frozen=True)
class EventRow:
    """One event, pending (with all it carries) or sent (as its record keeps it)."""

    reservation_id: UUID
    message_id: str
    hold_until: datetime | None  # None: sent (the record does not keep it)
    expired_at: datetime
    traceparent: str | None
    sent: bool


async def event_rows(url: str) -> list[EventRow]:
    """Every event of the database, pending or sent."""
    async with pg_connection(url) as conn:
        return [EventRow(*row) for row in await conn.fetch(EVENT_ROWS)]


async def events_by_reservation(url: str) -> dict[UUID, list[EventRow]]:
    """The events of each reservation that has any."""
    found: dict[UUID, list[EventRow]] = {}
    for row in await event_rows(url):
        found.setdefault(row.reservation_id, []).append(row)
    return found


async def expiries(url: str) -> dict[UUID, datetime]:
    """When each hold's held -> expired transition was recorded."""
    async with pg_connection(url) as conn:
        rows = await conn.fetch(
            "SELECT reservation_id, at FROM reservation_transitions "
            "WHERE from_status = 'held' AND to_status = 'expired'"
        )
    return {row["reservation_id"]: row["at"] for row in rows}


async def mark_all_sent(conn: asyncpg.Connection[asyncpg.Record]) -> int:
    """Move every pending event to the record of sent ones, as a relay's mark would."""
    moved: int = await conn.fetchval(
        """
        WITH sent AS (DELETE FROM expiry_events
                      RETURNING id, reservation_id, message_id, expired_at, created_at, claims)
        , recorded AS (
            INSERT INTO expiry_events_sent
                   (id, reservation_id, message_id, expired_at, created_at, claims, relay)
            SELECT id, reservation_id, message_id, expired_at, created_at, claims + 1, 'test'
              FROM sent RETURNING 1)
        SELECT count(*) FROM recorded
        """
    )
    return moved


@dataclass
class Notifications:
    """What a LISTENing connection received on the relays' channel, and when (the
    monotonic clock)."""

    at: list[float] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def heard(self, *_args: Any) -> None:
        self.at.append(time.monotonic())
        self.arrived.set()


@contextlib.asynccontextmanager
async def listening(url: str) -> AsyncIterator[Notifications]:
    """A connection LISTENing on ``expiry_events`` while the block runs."""
    heard = Notifications()
    async with pg_connection(url) as conn:
        await conn.add_listener(CHANNEL, heard.heard)
        try:
            yield heard
        finally:
            await conn.remove_listener(CHANNEL, heard.heard)


def traceparent(sampled: bool = False) -> str:
    """A fresh, well-formed W3C traceparent."""
    return f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-{'01' if sampled else '00'}"


async def publish_each(
    amqp_url: str, messages: Sequence[tuple[bytes, str, dict[str, Any]]]
) -> None:
    """Publish (body, message id, headers) commands to ``expirations``, with confirms."""
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange("expirations")
        for body, message_id, headers in messages:
            await exchange.publish(
                aio_pika.Message(
                    body,
                    content_type="application/json",
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    message_id=message_id,
                    headers=headers,
                ),
                "expire",
                mandatory=True,
            )
    finally:
        await connection.close()
