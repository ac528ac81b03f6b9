"""The 2xx answers of one courier, recorded in batches: one statement for every answer
waiting (``deliveries.delivered_all``), each delivery done only while its own lease
holds, every attempt logged, and the endpoint no longer failing.

An answer is handed over as it arrives, and its request's place is free at once for the
next one. It is written at once when no batch is being written; else it waits for the
batch in progress and goes with every other that came meanwhile: no timer, alone an
answer costs one round trip as before, under load one round trip serves many. Then it is
counted delivered; or, its lease lapsed (or the statement failed), said and counted as
a lapse: the delivery is left as it was, and sent again with its webhook-id. A courier
that stops waits for the batches (``written``).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from uuid import UUID

from service.adapters import postgres
from service.adapters.postgres import deliveries as rows
from service.adapters.telemetry.deliver_metrics import DeliverMetrics

log = logging.getLogger("service.deliver")

AGAIN = "its lease lapses and it is delivered again, with its webhook-id"


@dataclass(eq=False)
class Receipts:
    """Records the 2xx answers to one endpoint of one deliverer's claims (its ``token``)."""

    endpoint: str
    pool: postgres.Pool
    metrics: DeliverMetrics
    token: UUID
    waiting: list[tuple[rows.Delivery, rows.Attempted]] = field(default_factory=list)
    writing: asyncio.Task[None] | None = None

    def add(self, delivery: rows.Delivery, attempted: rows.Attempted) -> None:
        """Record it, with the others answered meanwhile."""
        self.waiting.append((delivery, attempted))
        if self.writing is None:
            self.writing = asyncio.create_task(self._write())

    async def written(self) -> None:
        """Until every answer handed over is recorded (or said lapsed)."""
        while self.writing is not None:
            await self.writing

    async def _write(self) -> None:
        """Batches, one after the other, until none waits."""
        try:
            while self.waiting:
                batch, self.waiting = self.waiting, []
                await self._write_batch(batch)
        finally:
            self.writing = None

    async def _write_batch(self, batch: list[tuple[rows.Delivery, rows.Attempted]]) -> None:
        answered = [(delivery.id, attempted) for delivery, attempted in batch]
        try:
            async with self.pool.acquire() as conn:
                done = await rows.delivered_all(conn, answered, token=self.token)
        except Exception as exc:  # the database, mostly: each lease lapses, sent again
            for delivery, _ in batch:
                self._lapsed(
                    "webhook.settle_failed", delivery, error_class=type(exc).__name__, then=AGAIN
                )
            return
        delivered = sum(1 for delivery, _ in batch if delivery.id in done)
        if delivered:
            self.metrics.delivered.add(delivered, {"endpoint": self.endpoint})
        for delivery, _ in batch:
            if delivery.id not in done:  # said loudly: it is made again (receivers dedupe)
                self._lapsed("webhook.lease_lapsed", delivery)

    def _lapsed(self, event: str, delivery: rows.Delivery, **said: str) -> None:
        log.warning(
            event, extra={"endpoint": self.endpoint, "message_id": delivery.message_id, **said}
        )
        self.metrics.lapsed.add(1, {"endpoint": self.endpoint})
