"""The service's metrics (OpenTelemetry instruments) and the database backlog they report."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Meter, Observation

from service.core.domain import Outcome

# Deadline-age buckets of the due backlog, in seconds: (label, upper bound).
BACKLOG_BUCKETS: tuple[tuple[str, float], ...] = (
    ("lt_10s", 10),
    ("10s_1m", 60),
    ("1m_5m", 300),
    ("5m_15m", 900),
    ("gt_15m", float("inf")),
)
LAG_BOUNDARIES = (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900)
DURATION_BOUNDARIES = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


@dataclass
class Backlog:
    """Due ``held`` reservations: the oldest one's age and counts by deadline age."""

    oldest_due_age_seconds: float = 0.0
    by_bucket: dict[str, int] = field(default_factory=lambda: {b: 0 for b, _ in BACKLOG_BUCKETS})

    @property
    def total(self) -> int:
        return sum(self.by_bucket.values())


class Metrics:
    """Counters and histograms of the consumer, and gauges of the backlog."""

    def __init__(self, meter: Meter | None = None) -> None:
        meter = meter or metrics.get_meter("service")
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
        self.processing = meter.create_histogram(
            "expiry.processing.duration",
            unit="s",
            description="Time to handle one delivery",
            explicit_bucket_boundaries_advisory=DURATION_BOUNDARIES,
        )
        self.lag = meter.create_histogram(
            "expiry.lag",
            unit="s",
            description="From a hold's deadline to its expiry (database clock)",
            explicit_bucket_boundaries_advisory=LAG_BOUNDARIES,
        )
        self.backlog = Backlog()
        meter.create_observable_gauge(
            "expiry.oldest_due_age",
            callbacks=[self._observe_oldest],
            unit="s",
            description="Age of the oldest due held reservation",
        )
        meter.create_observable_gauge(
            "expiry.backlog",
            callbacks=[self._observe_backlog],
            unit="{reservation}",
            description="Due held reservations by deadline age",
        )

    def outcome(self, outcome: Outcome, *, seconds: float, lag: float | None) -> None:
        """One delivery done."""
        self.commands.add(1, {"outcome": outcome.value})
        self.processing.record(seconds, {"outcome": outcome.value})
        if outcome is Outcome.ALREADY_DONE:
            self.duplicates.add(1)
        elif outcome is Outcome.NOT_ELIGIBLE:
            self.conflicts.add(1)
        elif lag is not None:
            self.lag.record(max(0.0, lag))

    def retried(self, error_class: str, *, seconds: float) -> None:
        """One delivery sent to a delay tier."""
        self.retries.add(1, {"error_class": error_class})
        self.processing.record(seconds, {"outcome": "retry"})

    def dead_lettered(self, error_class: str, give_up: str, *, seconds: float) -> None:
        """One delivery dead-lettered."""
        self.dead_letters.add(1, {"error_class": error_class, "give_up": give_up})
        self.processing.record(seconds, {"outcome": "dead-letter"})

    def _observe_oldest(self, _options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(self.backlog.oldest_due_age_seconds)

    def _observe_backlog(self, _options: CallbackOptions) -> Iterable[Observation]:
        for bucket, count in self.backlog.by_bucket.items():
            yield Observation(count, {"age": bucket})
