"""The relay's metrics (``python -m service.relay``; Prometheus names in docs/operations.md).

What it published (each event confirmed by the broker and marked sent), what it published
again (an event claimed before: a relay died or its lease lapsed before its mark), what
the broker did not take (unroutable, or not confirmed), the marks that found their lease
lapsed, and how long a batch took and an event waited from its expiry's commit to its
confirm. Units as in ``metrics.py``: ``expiry.relay.published`` is
``expiry_relay_published_total``, ``expiry.event.commit_to_confirm`` with unit ``s``
``expiry_event_commit_to_confirm_seconds``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from prometheus_client.registry import CollectorRegistry

from service.adapters.telemetry import histograms

BATCH_BOUNDARIES = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
COMMIT_TO_CONFIRM_BOUNDARIES = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
)

# The relay's histograms: (name, unit, description, bucket bounds).
HISTOGRAMS: tuple[histograms.Spec, ...] = (
    (
        "expiry.relay.batch.duration",
        "s",
        "Time of one relay batch: claim, publish with confirms, mark sent",
        BATCH_BOUNDARIES,
    ),
    (
        "expiry.event.commit_to_confirm",
        "s",
        "From an expiry's commit (expired_at, the database's clock) to its event's confirm",
        COMMIT_TO_CONFIRM_BOUNDARIES,
    ),
)

UNROUTABLE, UNCONFIRMED = "unroutable", "unconfirmed"


class RelayMetrics:
    """The relay's counters, histograms and gauges.

    With ``prometheus`` (the registry a scrape reads, when Prometheus is the only
    reader) the histograms are aggregated in the process (``histograms.py``), as the
    consumer's are; ``close`` takes them back out.
    """

    def __init__(
        self, meter: Meter | None = None, *, prometheus: CollectorRegistry | None = None
    ) -> None:
        meter = meter or metrics.get_meter("service")
        self.last_success: float | None = None  # the wall clock's epoch seconds
        self.is_listening: Callable[[], bool] = lambda: False  # the relay's listener tells
        self.published = meter.create_counter(
            "expiry.relay.published",
            unit="{event}",
            description="Events confirmed by the broker (then marked sent)",
        )
        self.republished = meter.create_counter(
            "expiry.relay.republished",
            unit="{event}",
            description="Events published again: claimed before, maybe published before",
        )
        self.unpublished = meter.create_counter(
            "expiry.relay.unpublished",
            unit="{event}",
            description="Events the broker returned (unroutable) or did not confirm, by reason",
        )
        self.marks_lost = meter.create_counter(
            "expiry.relay.marks_lost",
            unit="{event}",
            description="Events published whose claim had lapsed at the mark (published again)",
        )
        self.failures = meter.create_counter(
            "expiry.relay.failures", unit="{batch}", description="Batches failed, by error class"
        )
        self._histograms = histograms.Histograms(meter, HISTOGRAMS, prometheus)
        self.batch_duration, self.commit_to_confirm = self._histograms.recorders
        meter.create_observable_gauge(
            "expiry.relay.last_success_timestamp",
            callbacks=[self._observe_last_success],
            unit="s",
            description="When a relay batch (or an empty look) last succeeded (Unix time)",
        )
        meter.create_observable_gauge(
            "expiry.relay.listening",
            callbacks=[self._observe_listening],
            unit="1",
            description="1 while the relay LISTENs for wake-ups (else the poll alone covers)",
        )

    def close(self) -> None:
        """Take the histograms aggregated here back out of the registry they were shown in."""
        self._histograms.close()

    def batch(
        self,
        *,
        seconds: float,
        committed_at: Sequence[float],
        republished: int,
        confirmed_at: float,
    ) -> None:
        """A batch done: its events confirmed (their expiries' commit times, epoch seconds),
        how many of them were published before."""
        self.batch_duration.record(seconds)
        self.published.add(len(committed_at))
        if republished:
            self.republished.add(republished)
        for committed in committed_at:
            self.commit_to_confirm.record(max(0.0, confirmed_at - committed))
        self.last_success = time.time()

    def looked(self) -> None:
        """A look into the outbox that found nothing to publish succeeded."""
        self.last_success = time.time()

    def refused(self, reason: str, count: int) -> None:
        """``count`` events not published (``UNROUTABLE`` or ``UNCONFIRMED``)."""
        self.unpublished.add(count, {"reason": reason})

    def lost_marks(self, count: int) -> None:
        """``count`` published events whose mark found their lease lapsed."""
        self.marks_lost.add(count)

    def failed(self, error_class: str) -> None:
        """A batch failed (the database, mostly)."""
        self.failures.add(1, {"error_class": error_class})

    def _observe_last_success(self, _options: CallbackOptions) -> Iterable[Observation]:
        if self.last_success is not None:
            yield Observation(self.last_success)

    def _observe_listening(self, _options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(1 if self.is_listening() else 0)
