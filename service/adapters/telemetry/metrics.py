"""The service's metrics (OpenTelemetry instruments; Prometheus names in docs/operations.md).

``Metrics`` is the consumer's (outcomes, retries, dead letters, latencies),
``ScanMetrics`` the scanner's (passes, publishes, lapsed leases); each holds the
``Gauges`` (``readings.py``) of what its process reads from the database on a timer.
Units follow OpenTelemetry: ``s`` for seconds, ``{thing}`` for
counts; the Prometheus exporter turns ``expiry.lag`` with unit ``s`` into
``expiry_lag_seconds``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from prometheus_client.registry import CollectorRegistry

from service.adapters.telemetry import histograms
from service.adapters.telemetry.readings import Gauges
from service.core.domain import Outcome

LAG_BOUNDARIES = (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900)
DURATION_BOUNDARIES = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
PASS_BOUNDARIES = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


def _meter(meter: Meter | None) -> Meter:
    return meter or metrics.get_meter("service")


# The consumer's histograms: (name, unit, description, bucket bounds).
HISTOGRAMS: tuple[histograms.Spec, ...] = (
    ("expiry.processing.duration", "s", "Time to handle one delivery", DURATION_BOUNDARIES),
    (
        "expiry.lag",
        "s",
        "From a hold's deadline to its expiry (database clock)",
        LAG_BOUNDARIES,
    ),
    (
        "expiry.claim_to_finish",
        "s",
        "From the scan's confirmed publish of a hold to its expiry (database)",
        LAG_BOUNDARIES,
    ),
)

# The attributes of each outcome, made once (the SDK reads them on every call).
_OUTCOME_ATTRIBUTES = {outcome: {"outcome": outcome.value} for outcome in Outcome}


class Metrics:
    """The consumer's counters and histograms, and its gauges (``gauges``).

    With ``prometheus`` (the registry a scrape reads, when Prometheus is the only
    reader), its histograms are aggregated in the process and shown there as the
    OpenTelemetry exporter would (``histograms.py``: a value costs a microsecond, not
    ten); else they are the SDK's instruments. ``close`` takes them back out.
    """

    def __init__(
        self, meter: Meter | None = None, *, prometheus: CollectorRegistry | None = None
    ) -> None:
        meter = _meter(meter)
        self._counted: Counter[Outcome] = Counter()
        self._flush_scheduled = False
        self.gauges = Gauges(meter)
        self.commands = meter.create_counter(
            "expiry.commands", unit="{command}", description="Commands handled, by outcome"
        )
        self.duplicates = meter.create_counter(
            "expiry.duplicate_deliveries", unit="{command}", description="Commands already done"
        )
        self.conflicts = meter.create_counter(
            "expiry.state_conflicts",
            unit="{command}",
            description="Commands for holds consumed or not due (not-eligible)",
        )
        self.retries = meter.create_counter(
            "expiry.retries", unit="{command}", description="Commands sent to a delay tier"
        )
        self.dead_letters = meter.create_counter(
            "expiry.dead_letters", unit="{command}", description="Commands dead-lettered"
        )
        self.recorded = meter.create_counter(
            "expiry.dead_letters.recorded",
            unit="{dead_letter}",
            description="Dead-letterings recorded, whatever did them (the broker too)",
        )
        self._histograms = histograms.Histograms(meter, HISTOGRAMS, prometheus)
        self.processing, self.lag, self.claim_to_finish = self._histograms.recorders

    def close(self) -> None:
        """Take the histograms aggregated here back out of the registry they were shown in."""
        self._histograms.close()

    def outcome(
        self,
        outcome: Outcome,
        *,
        seconds: float,
        lag: float | None,
        since_published: float | None = None,
    ) -> None:
        """One delivery done: its latencies are recorded now, its counts added up and
        handed to the counters once per turn of the event loop (``flush``).

        Each call into the SDK costs microseconds (its attributes cleaned and hashed,
        a lock): at thousands of deliveries a second a counter's ``add(1)`` each was a
        cost the consumer paid per delivery, an ``add(n)`` per turn is not. A
        histogram has no such bulk record: each value is recorded.
        """
        self.processing.record(seconds, _OUTCOME_ATTRIBUTES[outcome])
        if outcome is Outcome.EXPIRED:
            if lag is not None:
                self.lag.record(max(0.0, lag))
            if since_published is not None:
                self.claim_to_finish.record(max(0.0, since_published))
        self._counted[outcome] += 1
        if not self._flush_scheduled:
            self._schedule_flush()

    def flush(self) -> None:
        """Add the counts of the outcomes since the last flush to the counters."""
        self._flush_scheduled = False
        counted, self._counted = self._counted, Counter()
        for outcome, count in counted.items():
            self.commands.add(count, _OUTCOME_ATTRIBUTES[outcome])
            if outcome is Outcome.ALREADY_DONE:
                self.duplicates.add(count)
            elif outcome is Outcome.NOT_ELIGIBLE:
                self.conflicts.add(count)

    def _schedule_flush(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop: at once
            self.flush()
            return
        self._flush_scheduled = True
        loop.call_soon(self.flush)

    def retried(self, error_class: str, *, seconds: float) -> None:
        """One delivery sent to a delay tier."""
        self.retries.add(1, {"error_class": error_class})
        self.processing.record(seconds, {"outcome": "retry"})

    def dead_lettered(self, error_class: str, give_up: str, *, seconds: float) -> None:
        """One delivery dead-lettered."""
        self.dead_letters.add(1, {"error_class": error_class, "give_up": give_up})
        self.processing.record(seconds, {"outcome": "dead-letter"})

    def dead_letter_recorded(self, error_class: str) -> None:
        """One dead-lettering recorded (a message dead-lettered again counts again)."""
        self.recorded.add(1, {"error_class": error_class})


class ScanMetrics:
    """The scanner's: what its passes did, and when one last succeeded."""

    def __init__(self, meter: Meter | None = None, *, interval_seconds: float = 0.0) -> None:
        meter = _meter(meter)
        self.gauges = Gauges(meter)
        self.last_success: float | None = None  # the wall clock's epoch seconds
        self.interval_seconds = interval_seconds
        self.passes = meter.create_counter(
            "expiry.scan.passes", unit="{pass}", description="Scan passes, by result"
        )
        self.published = meter.create_counter(
            "expiry.scan.published",
            unit="{command}",
            description="Commands confirmed by the broker",
        )
        self.unconfirmed = meter.create_counter(
            "expiry.scan.unconfirmed",
            unit="{command}",
            description="Commands the broker refused, returned or did not confirm in time",
        )
        self.lapsed = meter.create_counter(
            "expiry.scan.leases_lapsed",
            unit="{command}",
            description="Commands published again because their lease lapsed with the hold held",
        )
        self.duration = meter.create_histogram(
            "expiry.scan.duration",
            unit="s",
            description="Time of one scan pass",
            explicit_bucket_boundaries_advisory=PASS_BOUNDARIES,
        )
        meter.create_observable_gauge(
            "expiry.scan.last_success_timestamp",
            callbacks=[self._observe_last_success],
            unit="s",
            description="When a scan pass last succeeded (Unix time)",
        )
        meter.create_observable_gauge(
            "expiry.scan.interval",
            callbacks=[self._observe_interval],
            unit="s",
            description="produce --every: seconds from the start of one pass to the next",
        )

    def passed(
        self, result: str, *, seconds: float, published: int, unconfirmed: int, lapsed: int
    ) -> None:
        """One pass ended: ``ok``, ``failed`` or ``stopped``."""
        self.passes.add(1, {"result": result})
        self.duration.record(seconds, {"result": result})
        self.published.add(published)
        self.unconfirmed.add(unconfirmed)
        self.lapsed.add(lapsed)

    def _observe_last_success(self, _options: CallbackOptions) -> Iterable[Observation]:
        if self.last_success is not None:
            yield Observation(self.last_success)

    def _observe_interval(self, _options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(self.interval_seconds)
