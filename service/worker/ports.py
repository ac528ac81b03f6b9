"""What the consumer's runtime needs from the outside, as two small seams.

``Store`` (the guarded updates and the crash counter) and ``Publisher`` (the
confirmed retry and dead-letter copies): the runtime is tested with in-memory
fakes of both; ``PostgresStore`` and ``AmqpPublisher`` are the real ones.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Protocol
from uuid import UUID

import aio_pika
from aio_pika.abc import AbstractExchange
from opentelemetry import trace

from service.adapters import amqp, postgres
from service.core.domain import BatchRow, Expiry, Outcome
from service.core.errors import RowLocked
from service.core.topology import DEAD_ROUTING_KEY, delay_routing_key
from service.settings import Settings
from service.worker.delivery import Attempt
from service.worker.wakeup import SILENT, Waker

tracer = trace.get_tracer("service.consume")

BUSY_ROW_WAIT_MS = 1


class Store(Protocol):
    """The database as the consumer uses it."""

    async def expire_many(
        self,
        ids: Sequence[UUID],
        message_ids: Sequence[str],
        attempts: Sequence[int],
        traceparents: Sequence[str | None],
    ) -> dict[UUID, BatchRow]:
        """The guarded update for distinct ids, one statement, one commit; each winner's
        audit row (and so its event) records its delivery's trace (None: none)."""
        ...

    async def expire_one(
        self,
        reservation_id: UUID,
        attempt: Attempt,
        *,
        busy: bool = False,
        traceparent: str | None = None,
    ) -> Expiry:
        """The guarded update for one reservation, in a transaction of its own. ``busy``:
        another transaction was holding its row; wait for it only briefly, and raise
        ``RowLocked`` rather than wait for a connection."""
        ...

    async def mark_handling(self, key: str) -> int:
        """Count one more attempt at a redelivered command; how many there were."""
        ...

    async def clear_handling(self, key: str) -> None:
        """It was handled without a crash: forget its count."""
        ...


class Publisher(Protocol):
    """The broker as the consumer publishes to it (each publish confirmed or raising
    ``PublishNotConfirmed``)."""

    async def retry(self, message: aio_pika.Message, delay_ms: int) -> None:
        """To the delay queue of ``delay_ms`` (a slot of the topology)."""
        ...

    async def dead_letter(self, message: aio_pika.Message) -> None:
        """To the dead-letter exchange."""
        ...


class PostgresStore:
    """``Store`` on a connection pool; after a commit that expired a hold (and so wrote
    its event), ``wakeup`` is told (the relays are woken after it, coalesced)."""

    def __init__(
        self,
        pool: postgres.Pool,
        settings: Settings,
        *,
        for_batches: int = 0,
        wakeup: Waker = SILENT,
    ) -> None:
        self.pool = pool
        self.wakeup = wakeup
        self.worker = settings.worker_id
        self.acquire_timeout = (
            settings.db_connect_timeout_seconds + settings.statement_timeout_ms / 1000
        )
        # A delivery alone may wait on a row lock for up to the lock timeout: however
        # many do, ``for_batches`` of the pool's connections are left to the batches.
        self._alone = asyncio.Semaphore(max(1, settings.db_pool_size - for_batches))
        # A delivery whose row was held by another transaction hardly waits for it
        # (most likely the support side is consuming that hold): it is retried later.
        # Waiting would hold back its neighbours' coalesced acks, and the others expire
        # more slowly (figures: docs/benchmark.md#a-row-held-by-another-transaction).
        self.busy_wait_ms = min(settings.lock_timeout_ms, BUSY_ROW_WAIT_MS)

    async def expire_many(
        self,
        ids: Sequence[UUID],
        message_ids: Sequence[str],
        attempts: Sequence[int],
        traceparents: Sequence[str | None],
    ) -> dict[UUID, BatchRow]:
        async with self.pool.acquire() as conn:
            rows = await postgres.expire_batch(
                conn, ids, message_ids, attempts, traceparents, worker=self.worker
            )
        if any(row.won for row in rows.values()):
            self.wakeup.written()
        return rows

    async def expire_one(
        self,
        reservation_id: UUID,
        attempt: Attempt,
        *,
        busy: bool = False,
        traceparent: str | None = None,
    ) -> Expiry:
        if busy and self._alone.locked():
            raise RowLocked
        with tracer.start_as_current_span(
            "expire reservation", attributes={"db.system": "postgresql"}
        ) as span:
            async with self._alone_connection() as conn:
                expiry = await postgres.expire_reservation(
                    conn,
                    reservation_id,
                    message_id=attempt.message_id,
                    attempt=attempt.number,
                    worker=self.worker,
                    lock_wait_ms=self.busy_wait_ms if busy else None,
                    traceparent=traceparent,
                )
            if expiry.outcome is Outcome.EXPIRED:
                self.wakeup.written()
            span.set_attribute("expiry.outcome", expiry.outcome.value)
            return expiry

    @contextlib.asynccontextmanager
    async def _alone_connection(self) -> AsyncIterator[postgres.Connection]:
        """A connection of the pool for one delivery alone, within the acquire timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.acquire_timeout
        async with asyncio.timeout_at(deadline):
            await self._alone.acquire()
        try:
            async with self.pool.acquire(timeout=max(0.0, deadline - loop.time())) as conn:
                yield conn
        finally:
            self._alone.release()

    async def mark_handling(self, key: str) -> int:
        async with self.pool.acquire(timeout=self.acquire_timeout) as conn:
            return await postgres.mark_handling(conn, key)

    async def clear_handling(self, key: str) -> None:
        async with self.pool.acquire(timeout=self.acquire_timeout) as conn:
            await postgres.clear_handling(conn, key)


class AmqpPublisher:
    """``Publisher`` on a confirm channel's retry and dead-letter exchanges."""

    def __init__(
        self, retry_exchange: AbstractExchange, dead_exchange: AbstractExchange, timeout: float
    ) -> None:
        self.retry_exchange = retry_exchange
        self.dead_exchange = dead_exchange
        self.timeout = timeout

    async def retry(self, message: aio_pika.Message, delay_ms: int) -> None:
        key = delay_routing_key(delay_ms)
        await amqp.publish_confirmed(self.retry_exchange, message, key, timeout=self.timeout)

    async def dead_letter(self, message: aio_pika.Message) -> None:
        await amqp.publish_confirmed(
            self.dead_exchange, message, DEAD_ROUTING_KEY, timeout=self.timeout
        )
