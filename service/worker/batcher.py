"""Batched guarded updates: many deliveries, one statement, one commit.

Deliveries are validated one by one (``handler.py``), then handed here. A
worker gathers them (up to ``EXPIRY_BATCH_SIZE``, waiting at most
``EXPIRY_BATCH_WAIT_MS`` and only while more keep arriving) and runs one
set-based guarded update with its audit rows. Each delivery then gets its own
outcome (to the task awaiting it, or to its callback) and is acked only after
that commit. If the batch fails as a whole,
every delivery in it falls back to its own transaction, so that one bad
message can never fail, retry or dead-letter its neighbours.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from uuid import UUID

from opentelemetry import context as otel_context
from opentelemetry import trace

from service.adapters import postgres
from service.adapters.metrics import Metrics
from service.core.domain import duplicate_outcome, outcome_of
from service.core.errors import ServiceError, UnknownReservation

log = logging.getLogger("service.consume")
tracer = trace.get_tracer("service.consume")


class BatchFallback(ServiceError):
    """This delivery must be handled on its own (its batch failed, or its result was ambiguous)."""


class ConsumerStopping(BatchFallback):
    """The consumer stopped before this delivery's batch ran (it is left to redelivery)."""


Result = postgres.Expiry | BaseException


@dataclass(eq=False)
class Item:
    """One validated delivery waiting for its batch.

    Its outcome goes to ``future`` (a delivery task awaits it) or, when there
    is none, to ``on_result`` (called from the batch's task, which must not raise).
    """

    reservation_id: UUID
    message_id: str
    attempt: int
    future: asyncio.Future[postgres.Expiry] | None
    span_context: trace.SpanContext
    context: otel_context.Context = field(default_factory=otel_context.get_current)
    on_result: Callable[[Result], None] | None = None
    given: bool = False

    @property
    def abandoned(self) -> bool:
        """Its delivery task was cancelled (with its channel): nobody waits any more."""
        return self.future is not None and self.future.cancelled()

    @property
    def settled(self) -> bool:
        """It has its outcome already (or nobody waits for it)."""
        return self.given or (self.future is not None and self.future.done())

    def give(self, result: Result) -> None:
        """Hand over its outcome, once."""
        if self.settled:
            return
        self.given = True
        if self.future is not None:
            if isinstance(result, BaseException):
                self.future.set_exception(result)
            else:
                self.future.set_result(result)
        elif self.on_result is not None:
            try:
                self.on_result(result)
            except Exception:  # one delivery's report must not keep the others from theirs
                log.exception("expiry.report_failed", extra={"message_id": self.message_id})


def settle_items(
    items: list[Item], rows: dict[UUID, postgres.BatchRow]
) -> list[tuple[Item, postgres.Expiry]]:
    """Give each item its outcome: the first copy of an id its row's, later copies theirs.

    Returns the transitions this batch made for deliveries nobody waits for any
    more (their task was cancelled with their channel): the effect is committed,
    so it must still be logged and counted once, here.
    """
    first: dict[UUID, postgres.Expiry] = {}
    orphans: list[tuple[Item, postgres.Expiry]] = []
    for item in items:
        if item.abandoned:
            row = rows.get(item.reservation_id)
            if row is not None and row.won and item.reservation_id not in first:
                first[item.reservation_id] = postgres.Expiry(
                    outcome_of(won=True, status=row.status, due=row.due), row.lag
                )
                orphans.append((item, first[item.reservation_id]))
            continue
        if item.settled:
            continue
        if item.reservation_id in first:
            earlier = first[item.reservation_id]
            item.give(postgres.Expiry(duplicate_outcome(earlier.outcome), None))
            continue
        row = rows.get(item.reservation_id)
        try:
            if row is None:
                raise BatchFallback("no result for this reservation")
            expiry = postgres.Expiry(
                outcome_of(won=row.won, status=row.status, due=row.due), row.lag
            )
        except UnknownReservation as exc:
            item.give(exc)
            continue
        except ServiceError as exc:  # ambiguous (a concurrent change): decide it alone
            item.give(BatchFallback(str(exc)))
            continue
        first[item.reservation_id] = expiry
        item.give(expiry)
    return orphans


class Batcher:
    """Gathers deliveries and runs their guarded updates together."""

    def __init__(
        self,
        pool: postgres.Pool,
        *,
        worker: str,
        size: int,
        wait_ms: float,
        workers: int,
        metrics: Metrics | None = None,
    ) -> None:
        self.pool = pool
        self.metrics = metrics
        self.worker = worker
        self.size = size
        self.wait = wait_ms / 1000
        # A deque and an event: asyncio.Queue costs a few microseconds per item more.
        self.queue: deque[Item] = deque()
        self._arrived = asyncio.Event()
        self.tasks = [asyncio.create_task(self._work()) for _ in range(workers)]

    def put(self, item: Item) -> None:
        """Queue ``item``; its outcome goes to its ``on_result`` after its batch."""
        self.queue.append(item)
        self._arrived.set()

    async def submit(self, reservation_id: UUID, message_id: str, attempt: int) -> postgres.Expiry:
        """Wait for this delivery's outcome (raises ``BatchFallback`` to go it alone)."""
        future: asyncio.Future[postgres.Expiry] = asyncio.get_running_loop().create_future()
        span_context = trace.get_current_span().get_span_context()
        item = Item(reservation_id, message_id, attempt, future, span_context)
        self.put(item)
        try:
            return await future
        except asyncio.CancelledError:
            # Cancelled with its channel after the batch had already given it its
            # outcome: the effect is committed, so report it here, once.
            if future.done() and not future.cancelled() and future.exception() is None:
                self.report_orphan(item, future.result())
            raise

    def report_orphan(self, item: Item, expiry: postgres.Expiry) -> None:
        """Log and count an outcome no delivery task is left to report (never acked)."""
        log.info(
            "expiry.outcome",
            extra={
                "reservation_id": str(item.reservation_id),
                "message_id": item.message_id,
                "attempt": item.attempt,
                "outcome": expiry.outcome.value,
                "acked": False,
                "orphaned": True,
            },
        )
        if self.metrics is not None:
            self.metrics.outcome(expiry.outcome, seconds=0.0, lag=expiry.lag_seconds)

    async def close(self) -> None:
        """Stop the workers (call after the deliveries drained)."""
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        while self.queue:
            self.queue.popleft().give(ConsumerStopping("consumer stopping"))

    async def _gather(self) -> list[Item]:
        while not self.queue:
            self._arrived.clear()
            await self._arrived.wait()
        batch = [self.queue.popleft()]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait
        while len(batch) < self.size:
            while len(batch) < self.size and self.queue:
                batch.append(self.queue.popleft())
            if len(batch) >= self.size or loop.time() >= deadline:
                break
            await asyncio.sleep(0)  # let the connection read what has arrived
            if not self.queue:
                break  # nothing more is coming right now: never wait on an empty queue
        return batch

    async def _work(self) -> None:
        while True:
            batch = await self._gather()
            try:
                await self.run(batch)
            except asyncio.CancelledError:
                for item in batch:
                    item.give(ConsumerStopping("consumer stopping"))
                raise

    async def run(self, batch: list[Item]) -> None:
        """One transaction for the batch; on failure every item falls back to its own."""
        ids: dict[UUID, Item] = {}
        for item in batch:
            ids.setdefault(item.reservation_id, item)
        parent = batch[0].context if len(batch) == 1 else otel_context.Context()
        links = [trace.Link(item.span_context) for item in batch if item.span_context.is_valid]
        with tracer.start_as_current_span(
            "expire reservations",
            context=parent,
            links=links if len(batch) > 1 else None,
            attributes={"db.system": "postgresql", "expiry.batch_size": len(batch)},
        ):
            try:
                async with self.pool.acquire() as conn:
                    rows = await postgres.expire_batch(
                        conn,
                        list(ids),
                        [item.message_id for item in ids.values()],
                        [item.attempt for item in ids.values()],
                        worker=self.worker,
                    )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning(
                    "expiry.batch_failed",
                    extra={"batch_size": len(batch), "error": type(exc).__name__},
                )
                for item in batch:
                    item.give(BatchFallback("its batch failed"))
                return
        for item, expiry in settle_items(batch, rows):
            # Committed, never acked (its channel is gone): the redelivery will be already-done.
            self.report_orphan(item, expiry)
