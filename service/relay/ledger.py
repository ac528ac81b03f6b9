"""What the relay did: each batch's counts, its metrics, and its warning lines.

A batch whose events the broker did not all take says so in one line (``relay.unroutable``
naming the exchange: no queue is bound; ``relay.publish_failed``: nacked, no confirm in
time, the channel lost); a mark that found its lease lapsed says so loudly
(``relay.mark_lost``: those events are published again, with the same ids); a batch that
raised, ``relay.batch_failed``. The totals are the relay's last line (``relay.stopped``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from service.adapters.postgres.outbox import PendingEvent
from service.adapters.telemetry.relay_metrics import UNCONFIRMED, UNROUTABLE, RelayMetrics

log = logging.getLogger("service.relay")


@dataclass
class Batch:
    """What one batch did."""

    claimed: int = 0
    published: int = 0
    marked: int = 0
    unroutable: int = 0
    unconfirmed: int = 0
    reason: str | None = None  # why the first unpublished one was not confirmed

    @property
    def failed(self) -> bool:
        """Some event was not published: the relay pauses before the next try."""
        return bool(self.unroutable or self.unconfirmed)


class Ledger:
    """The relay's totals since it started, kept with its metrics and its lines."""

    def __init__(
        self, metrics: RelayMetrics, *, exchange: str, routing_key: str, lease_seconds: float
    ) -> None:
        self.metrics = metrics
        self.exchange = exchange
        self.routing_key = routing_key
        self.lease_seconds = lease_seconds
        self.published = 0
        self.republished = 0
        self.marks_lost = 0
        self.failed_batches = 0

    def refused(self, batch: Batch, *, retry_in: float) -> None:
        """One warning line for the events the broker did not take; they stay pending."""
        self.failed_batches += 1
        if batch.unroutable:
            self.metrics.refused(UNROUTABLE, batch.unroutable)
            log.warning(
                "relay.unroutable",
                extra={
                    "exchange": self.exchange,
                    "routing_key": self.routing_key,
                    "events": batch.unroutable,
                    "retry_in_seconds": retry_in,
                    "reason": "no queue is bound to the exchange for the routing key: the "
                    "events stay pending until one is",
                },
            )
        if batch.unconfirmed:
            self.metrics.refused(UNCONFIRMED, batch.unconfirmed)
            log.warning(
                "relay.publish_failed",
                extra={
                    "exchange": self.exchange,
                    "events": batch.unconfirmed,
                    "reason": batch.reason,
                    "retry_in_seconds": retry_in,
                },
            )

    def confirmed(
        self, batch: Batch, events: Sequence[PendingEvent], *, seconds: float, at: float
    ) -> None:
        """The batch's confirmed ``events`` (at ``at``, epoch seconds) in the metrics and the
        totals; a loud line if their marks were lost."""
        republished = sum(event.claims > 1 for event in events)
        self.metrics.batch(
            seconds=seconds,
            committed_at=[event.expired_at.timestamp() for event in events],
            republished=republished,
            confirmed_at=at,
        )
        self.published += len(events)
        self.republished += republished
        lost = len(events) - batch.marked
        if lost > 0:
            self.marks_lost += lost
            self.metrics.lost_marks(lost)
            log.warning(
                "relay.mark_lost",
                extra={
                    "published": len(events),
                    "marked": batch.marked,
                    "lost": lost,
                    "lease_seconds": self.lease_seconds,
                    "reason": "the claim's lease lapsed before the mark: those events are "
                    "published again, with the same message ids, by the next claim",
                },
            )

    def failed(self, error_class: str, error: str, *, retry_in: float) -> None:
        """A batch that raised (the database, mostly)."""
        self.failed_batches += 1
        self.metrics.failed(error_class)
        log.warning(
            "relay.batch_failed",
            extra={"error_class": error_class, "error": error, "retry_in_seconds": retry_in},
        )

    def facts(self) -> dict[str, int]:
        """The totals, for the relay's last line."""
        return {
            "published": self.published,
            "republished": self.republished,
            "marks_lost": self.marks_lost,
            "failed_batches": self.failed_batches,
        }
