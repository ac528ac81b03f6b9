"""The dead-letter recorder: every dead letter becomes a durable record an operator can query.

It reads ``expirations.dead.log`` (a copy of everything that reaches the
dead-letter exchange, whichever path it took) and upserts ``dead_letters``;
``expirations.dead`` itself is left for inspection and replay. Every delivery
ends in exactly one way: acked after its record committed, or given back to
its queue while the database is away (``returns.give_back``, which never lets
it reach the queue's delivery limit). A record the database refuses for its
values is stored again in a reduced form that says why; a message that
cannot even be read into a record is stored as an unreadable one.

Each record keeps the retry policy of this consumer (its settings, never the
message's headers), and a record nobody owns yet gets its default owner
(``EXPIRY_DEAD_LETTER_OWNERS``) in the same transaction, audited.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from aio_pika.abc import AbstractExchange, AbstractIncomingMessage

from service.adapters import amqp, postgres
from service.adapters.amqp.returns import give_back
from service.adapters.classify import classify, refuses_values
from service.adapters.telemetry.metrics import Metrics
from service.core.dead_letter import (
    DeadLetterRecord,
    build_record,
    reduced_record,
    unreadable_record,
)
from service.core.default_owners import default_owner
from service.core.recorded_policy import policy_in_force
from service.core.topology import DEAD_LOG_QUEUE
from service.settings import Settings
from service.worker.inflight import InFlight

log = logging.getLogger(__name__)

RECORDER_PREFETCH = 10
# Backoff while the database is away: 1, 2, 4, ... 30 s, about 3 minutes in all.
RECORD_ATTEMPTS = 10
MAX_BACKOFF_SECONDS = 30.0


class Recorder:
    """Handles deliveries of ``expirations.dead.log``."""

    def __init__(
        self,
        pool: postgres.Pool,
        in_flight: InFlight,
        dead_exchange: AbstractExchange,
        *,
        settings: Settings,
        metrics: Metrics,
    ) -> None:
        self.metrics = metrics
        self.pool = pool
        self.in_flight = in_flight
        self.dead_exchange = dead_exchange
        self.publish_timeout = settings.publish_timeout_seconds
        self.policy = policy_in_force(settings)
        self.owner_rules = settings.dead_letter_owners

    async def on_message(self, message: AbstractIncomingMessage) -> None:
        """Record one dead letter, then ack; give it back if the database stays away."""
        self.in_flight.track()
        record = read_record(message)
        if not await self._store_safely(record):
            await give_back(
                message,
                dead_exchange=self.dead_exchange,
                queue=DEAD_LOG_QUEUE,
                timeout=self.publish_timeout,
            )
            return
        self.metrics.dead_letter_recorded(record.error_class)
        if await amqp.settle(message.ack, record.message_id):
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

    async def _store_safely(self, record: DeadLetterRecord) -> bool:
        """``_store``, with a net: a bug on the way stores the least record there is."""
        try:
            return await self._store(record)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("deadletter.record_failed", extra={"message_id": record.message_id})
            why = type(exc).__name__
        least = unreadable_record(record.message_id, b"", record.last_seen, why)
        try:
            return await self._store(least)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("deadletter.record_failed", extra={"message_id": record.message_id})
            await asyncio.sleep(MAX_BACKOFF_SECONDS)  # no hot loop of give-backs
            return False

    async def _store(self, record: DeadLetterRecord) -> bool:
        """Store ``record`` (reduced once if its values are refused); False if the
        database stayed away through every attempt."""
        reduced = False
        for attempt in range(RECORD_ATTEMPTS):
            try:
                await self._record(record)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if refuses_values(exc) and not reduced:
                    log.warning(
                        "deadletter.record_reduced",
                        extra={"message_id": record.message_id, "error": type(exc).__name__},
                    )
                    record, reduced = reduced_record(record, type(exc).__name__), True
                    continue
                log.warning(
                    "deadletter.record_failed",
                    extra={"message_id": record.message_id, "error_class": classify(exc)[1]},
                )
                await asyncio.sleep(min(2.0**attempt, MAX_BACKOFF_SECONDS))
            else:
                return True
        return False

    async def _record(self, record: DeadLetterRecord) -> None:
        """One transaction: the record with this consumer's policy, and its default owner
        if it has none yet."""
        owner = default_owner(self.owner_rules, record.error_class)
        async with self.pool.acquire() as conn:
            assigned = await postgres.record_dead_letter(
                conn, record, policy=self.policy, owner=owner
            )
        if assigned and owner is not None:
            log.info(
                "deadletter.owner_assigned",
                extra={
                    "message_id": record.message_id,
                    "owner": owner.owner,
                    "pattern": owner.pattern,
                    "error_class": record.error_class,
                },
            )


def read_record(message: AbstractIncomingMessage) -> DeadLetterRecord:
    """The record of a delivery; an unreadable one if reading it fails in any way."""
    now = datetime.now(UTC)
    try:
        return build_record(message.headers, message.body, message.message_id, now)
    except Exception as exc:  # build_record is total; this is the net under it
        log.exception("deadletter.unreadable")
        return unreadable_record(message.message_id, message.body, now, type(exc).__name__)
