"""Batched guarded updates: many deliveries, one statement, one commit.

Deliveries are validated one by one (``consumer.py``), then handed here. A
worker gathers them (up to ``EXPIRY_BATCH_SIZE``, waiting at most
``EXPIRY_BATCH_WAIT_MS`` and only while more keep arriving) and runs one
set-based guarded update with its audit rows. Each delivery then gets its own
outcome, through its callback, and is acked only after that commit. If the
batch fails as a whole, every delivery in it falls back to its own
transaction, so that one bad message can never fail, retry or dead-letter
its neighbours. A batch size of 1 is the per-message path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from uuid import UUID

from opentelemetry import trace
from opentelemetry.instrumentation.utils import suppress_instrumentation

from service.adapters.telemetry.recording import RecordedSpan
from service.core.domain import BatchRow, Expiry, duplicate_outcome, outcome_of
from service.core.errors import ServiceError, UnknownReservation
from service.worker.ports import Store

log = logging.getLogger("service.consume")


class BatchFallback(ServiceError):
    """This delivery must be handled on its own (its batch failed, or its result was ambiguous)."""


class RowBusy(BatchFallback):
    """Its row was held by another transaction (the batch skips such rows), or changed
    under the batch: it is tried once more alone, hardly waiting for its row, and else
    retried later."""


class ConsumerStopping(BatchFallback):
    """The consumer stopped before this delivery's batch ran (it is left to redelivery)."""


Result = Expiry | BaseException

# Turns of the event loop a growing batch gives the connection to bring more deliveries
# (each costs nothing when idle; the batch still closes at EXPIRY_BATCH_WAIT_MS).
READ_TURNS = 2


@dataclass(eq=False)
class Item:
    """One validated delivery waiting for its batch; its outcome goes to ``on_result``
    (called once, from the batch's task, and which must not raise)."""

    reservation_id: UUID
    message_id: str
    attempt: int
    on_result: Callable[[Result], None]
    span: trace.Span = trace.INVALID_SPAN  # its delivery's: a RecordedSpan when sampled
    traceparent: str | None = None  # recorded with its expiry (``Delivery.traceparent``)
    given: bool = False

    def give(self, result: Result) -> None:
        """Hand over its outcome, once."""
        if self.given:
            return
        self.given = True
        try:
            self.on_result(result)
        except Exception:  # one delivery's report must not keep the others from theirs
            log.exception("expiry.report_failed", extra={"message_id": self.message_id})


def settle_items(items: list[Item], rows: dict[UUID, BatchRow]) -> None:
    """Give each item its outcome: the first copy of an id its row's, later copies theirs."""
    first: dict[UUID, Expiry] = {}
    for item in items:
        if item.given:
            continue
        if item.reservation_id in first:
            item.give(Expiry(duplicate_outcome(first[item.reservation_id].outcome), None))
            continue
        row = rows.get(item.reservation_id)
        try:
            if row is None:
                raise BatchFallback("no result for this reservation")
            outcome = outcome_of(won=row.won, status=row.status, due=row.due)
            expiry = Expiry(outcome, row.lag, row.since_published)
        except UnknownReservation as exc:
            item.give(exc)
            continue
        except ServiceError as exc:  # a locked row, or a concurrent change: decide it alone
            item.give(RowBusy(str(exc)))
            continue
        first[item.reservation_id] = expiry
        item.give(expiry)


class Batcher:
    """Gathers deliveries and runs their guarded updates together."""

    def __init__(self, store: Store, *, size: int, wait_ms: float, workers: int) -> None:
        self.store = store
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

    async def submit(
        self, reservation_id: UUID, message_id: str, attempt: int, traceparent: str | None = None
    ) -> Expiry:
        """Put one and wait for its outcome (raises it if it is an exception)."""
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        item = Item(reservation_id, message_id, attempt, future.set_result, traceparent=traceparent)
        self.put(item)
        result = await future
        if isinstance(result, BaseException):
            raise result
        return result

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
            # Let the connection read what has arrived: a read's bytes land in one turn
            # of the loop, and its deliveries reach this queue in the next (the reader
            # is a task the read wakes up). One turn was too few: a loaded consumer's
            # batches held what one read brought (mean 17, 8 when tracing).
            for _ in range(READ_TURNS):
                await asyncio.sleep(0)
                if self.queue:
                    break
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
        with _batch_span(batch):
            try:
                rows = await self.store.expire_many(
                    list(ids),
                    [item.message_id for item in ids.values()],
                    [item.attempt for item in ids.values()],
                    [item.traceparent for item in ids.values()],
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
        settle_items(batch, rows)


# The batch's span is the database client span of its statement (the SDK's query span
# under it would be a second span per batch with nothing more to say).
BATCH_SPAN_ATTRIBUTES = {
    "db.system": "postgresql",
    "db.operation": "UPDATE",
    "db.sql.table": "reservations",
}


@contextlib.contextmanager
def _batch_span(batch: list[Item]) -> Iterator[None]:
    """The batch's database span, when one of its deliveries is sampled: a child of the
    first such delivery's span, linked to the others' (a link to a span that is not
    kept leads nowhere). Else none. Either way no instrumented query under it makes a
    span: a batch of unsampled deliveries does no tracing work."""
    kept = [item.span for item in batch if isinstance(item.span, RecordedSpan)]
    if not kept:
        with suppress_instrumentation():
            yield
        return
    span = kept[0].child(
        "expire reservations",
        trace.SpanKind.CLIENT,
        {**BATCH_SPAN_ATTRIBUTES, "expiry.batch_size": len(batch)},
        kept[1:],
    )
    with trace.use_span(span, end_on_exit=True), suppress_instrumentation():
        yield
