"""What a process read from the database at its last refresh, as gauges: the due backlog,
the clock's drift, open dead letters (by class, unowned, the oldest one's age), the outbox's
backlog (pending events, the oldest one's age), what retention keeps; beside the settings
the alert rules compare with (the objectives, the drift tolerance). ``gauges.py`` reads
them; ``metrics.py`` gives each process its ``Gauges``. Prometheus names in
docs/operations.md (``expiry.events.pending`` is ``expiry_events_pending``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Meter, Observation

# Deadline-age buckets of the due backlog, in seconds: (label, upper bound).
BACKLOG_BUCKETS: tuple[tuple[str, float], ...] = (
    ("lt_10s", 10),
    ("10s_1m", 60),
    ("1m_5m", 300),
    ("5m_15m", 900),
    ("gt_15m", float("inf")),
)


@dataclass
class Backlog:
    """Due ``held`` reservations: the oldest one's age and counts by deadline age."""

    oldest_due_age_seconds: float = 0.0
    by_bucket: dict[str, int] = field(default_factory=lambda: {b: 0 for b, _ in BACKLOG_BUCKETS})

    @property
    def total(self) -> int:
        return sum(self.by_bucket.values())


Observe = Callable[["Gauges", CallbackOptions], Iterable[Observation]]


def _value(read: Callable[[Gauges], float | None]) -> Observe:
    """One unlabelled observation, none while the value is unknown (``None``)."""

    def observe(gauges: Gauges, _options: CallbackOptions) -> Iterable[Observation]:
        value = read(gauges)
        if value is not None:
            yield Observation(value)

    return observe


def _by(label: str, read: Callable[[Gauges], Mapping[str, float] | None]) -> Observe:
    """One observation a key, labelled ``label``; none while unknown (``None``)."""

    def observe(gauges: Gauges, _options: CallbackOptions) -> Iterable[Observation]:
        for key, count in (read(gauges) or {}).items():
            yield Observation(count, {label: key})

    return observe


class Gauges:
    """What the database said at the last refresh, and the settings alerts compare with."""

    def __init__(self, meter: Meter | None = None) -> None:
        meter = meter or metrics.get_meter("service")
        self.backlog = Backlog()
        self.clock_drift_seconds: float | None = None  # this worker's clock minus the database's
        self.open_dead_letters: dict[str, int] | None = None  # None: not read by this process
        self.unowned_dead_letters: int | None = None  # the same
        self.oldest_open_dead_letter_age_seconds: float | None = None  # the same
        self.events_pending: int | None = None  # the outbox's (None: not read by this process)
        self.oldest_pending_event_age_seconds: float | None = None  # the same; 0: none
        self.events_objective_seconds = 0.0
        self.objective_seconds = 0.0
        self.drift_tolerance_seconds = 0.0
        self.dead_letter_age_objective_seconds = 0.0
        # Retention (None: not read yet): each table's bytes; each audit table's oldest
        # partition start (Unix time) and how far its partitions reach past now; the last
        # retention run that succeeded (Unix time, 0: none).
        self.table_bytes: dict[str, float] | None = None
        self.retained_since: dict[str, float] | None = None
        self.partitions_ahead_seconds: dict[str, float] | None = None
        self.retention_last_success: float | None = None
        for name, unit, description, observe in GAUGES:
            meter.create_observable_gauge(
                name, callbacks=[partial(observe, self)], unit=unit, description=description
            )


# Every gauge: (name, unit, description, how it reads a ``Gauges``).
GAUGES: tuple[tuple[str, str, str, Observe], ...] = (
    (
        "expiry.oldest_due_age",
        "s",
        "Age of the oldest due held reservation",
        _value(lambda g: g.backlog.oldest_due_age_seconds),
    ),
    (
        "expiry.backlog",
        "{reservation}",
        "Due held reservations by deadline age",
        _by("age", lambda g: g.backlog.by_bucket),
    ),
    (
        "expiry.clock.drift",
        "s",
        "This worker's clock minus the database's (positive: the worker is ahead)",
        _value(lambda g: g.clock_drift_seconds),
    ),
    (
        "expiry.dead_letters.open",
        "{dead_letter}",
        "Dead letters not replayed, by error class",
        _by("error_class", lambda g: g.open_dead_letters),
    ),
    (
        "expiry.dead_letters.unowned",
        "{dead_letter}",
        "Open dead letters that nobody owns",
        _value(lambda g: g.unowned_dead_letters),
    ),
    (
        "expiry.oldest_open_dead_letter_age",
        "s",
        "Since the oldest open dead letter was last dead-lettered (0: none open)",
        _value(lambda g: g.oldest_open_dead_letter_age_seconds),
    ),
    (
        "expiry.events.pending",
        "{event}",
        "Events written by expiries and not yet published (the outbox's backlog)",
        _value(lambda g: g.events_pending),
    ),
    (
        "expiry.events.oldest_pending_age",
        "s",
        "Since the oldest pending event was written (database clock; 0: none pending)",
        _value(lambda g: g.oldest_pending_event_age_seconds),
    ),
    (
        "expiry.events.objective",
        "s",
        "EXPIRY_EVENTS_OBJECTIVE_SECONDS: the oldest pending event's age must stay below it",
        _value(lambda g: g.events_objective_seconds),
    ),
    (
        "expiry.table.size",
        "By",
        "Bytes on disk of each of the service's tables (all partitions, indexes, TOAST)",
        _by("table", lambda g: g.table_bytes),
    ),
    (
        "expiry.audit.retained_since",
        "s",
        "Where each audit table's oldest partition begins (Unix time): nothing older is kept",
        _by("table", lambda g: g.retained_since),
    ),
    (
        "expiry.audit.partitions_ahead",
        "s",
        "How far each audit table's partitions reach past now (a row later has no partition)",
        _by("table", lambda g: g.partitions_ahead_seconds),
    ),
    (
        "expiry.retention.last_success_timestamp",
        "s",
        "When python -m service.retention last succeeded (Unix time; 0: never)",
        _value(lambda g: g.retention_last_success),
    ),
    (
        "expiry.dead_letter_age_objective",
        "s",
        "EXPIRY_DEAD_LETTER_AGE_OBJECTIVE_SECONDS: how long a dead letter may stay open",
        _value(lambda g: g.dead_letter_age_objective_seconds),
    ),
    (
        "expiry.oldest_due_objective",
        "s",
        "EXPIRY_OLDEST_DUE_OBJECTIVE_SECONDS: the oldest due hold's age must stay below it",
        _value(lambda g: g.objective_seconds),
    ),
    (
        "expiry.clock.drift_tolerance",
        "s",
        "EXPIRY_CLOCK_DRIFT_TOLERANCE_SECONDS: how far a worker's clock may be off",
        _value(lambda g: g.drift_tolerance_seconds),
    ),
)
