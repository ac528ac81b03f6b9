"""The dead-letter recorder: every dead letter becomes a durable record an operator can query.

It reads ``expirations.dead.log`` (a copy of everything that reaches the
dead-letter exchange, whichever path it took) and upserts ``dead_letters``;
``expirations.dead`` itself is left for inspection and replay. Acked only
after the record committed; while the database is away it waits and tries
again, then returns the message to its queue.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from aio_pika.abc import AbstractIncomingMessage

from service import broker, db
from service.errors import classify
from service.records import DeadLetterRecord, build_record

log = logging.getLogger(__name__)

RECORDER_PREFETCH = 10
# Backoff while the database is away: 1, 2, 4, ... 30 s, about 3 minutes in all.
RECORD_ATTEMPTS = 10
MAX_BACKOFF_SECONDS = 30.0


class Recorder:
    """Handles deliveries of ``expirations.dead.log``."""

    def __init__(self, pool: db.Pool, in_flight: broker.InFlight) -> None:
        self.pool = pool
        self.in_flight = in_flight

    async def on_message(self, message: AbstractIncomingMessage) -> None:
        """Record one dead letter, then ack; give it back if the database stays away."""
        self.in_flight.track()
        record = build_record(message.headers, message.body, message.message_id, datetime.now(UTC))
        if not await self._store(record):
            await broker.settle(lambda: message.nack(requeue=True), record.message_id)
            return
        if await broker.settle(message.ack, record.message_id):
            log.info(
                "deadletter.recorded",
                extra={
                    "message_id": record.message_id,
                    "reservation_id": str(record.reservation_id or "-"),
                    "error_class": record.error_class,
                    "give_up": record.give_up,
                    "attempts": record.attempts,
                },
            )

    async def _store(self, record: DeadLetterRecord) -> bool:
        for attempt in range(RECORD_ATTEMPTS):
            try:
                async with self.pool.acquire() as conn:
                    await db.record_dead_letter(conn, record)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning(
                    "deadletter.record_failed",
                    extra={"message_id": record.message_id, "error_class": classify(exc)[1]},
                )
                await asyncio.sleep(min(2.0**attempt, MAX_BACKOFF_SECONDS))
            else:
                return True
        return False
