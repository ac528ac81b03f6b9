"""The dead-letter gauges: unowned and oldest-open only where they were read, and the age
objective from its setting."""

from __future__ import annotations

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from service.adapters.telemetry.gauges import configure
from service.adapters.telemetry.readings import Gauges
from service.settings import Settings


def _values(reader: InMemoryMetricReader) -> dict[str, float]:
    """Each gauge without attributes: its value."""
    found: dict[str, float] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    if not point.attributes:
                        found[metric.name] = float(getattr(point, "value", 0))
    return found


def _gauges() -> tuple[Gauges, InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    return Gauges(MeterProvider(metric_readers=[reader]).get_meter("test")), reader


def test_the_age_objective_is_exported_from_its_setting() -> None:
    """EXPIRY_DEAD_LETTER_AGE_OBJECTIVE_SECONDS becomes the gauge the alert compares with."""
    gauges, reader = _gauges()
    configure(gauges, Settings(dead_letter_age_objective_seconds=7200))
    assert _values(reader)["expiry.dead_letter_age_objective"] == 7200


def test_unowned_and_oldest_open_have_no_series_until_read() -> None:
    """A process that may not read dead letters (the scan) reports neither, not a zero."""
    _, reader = _gauges()
    values = _values(reader)
    assert "expiry.dead_letters.unowned" not in values
    assert "expiry.oldest_open_dead_letter_age" not in values


def test_unowned_and_oldest_open_report_what_was_read_zero_included() -> None:
    """Once read, each is reported as read; none open reads as zero, which is a series."""
    gauges, reader = _gauges()
    gauges.unowned_dead_letters, gauges.oldest_open_dead_letter_age_seconds = 3, 125.5
    values = _values(reader)
    assert values["expiry.dead_letters.unowned"] == 3
    assert values["expiry.oldest_open_dead_letter_age"] == 125.5
    gauges.unowned_dead_letters, gauges.oldest_open_dead_letter_age_seconds = 0, 0.0
    values = _values(reader)
    assert values["expiry.dead_letters.unowned"] == 0
    assert values["expiry.oldest_open_dead_letter_age"] == 0


def test_the_outbox_gauges_report_what_was_read_and_the_objective_its_setting() -> None:
    """expiry_events_pending and expiry_events_oldest_pending_age_seconds: no series until
    read (a process that may not read the outbox reports none), then what was read, zero
    included; EXPIRY_EVENTS_OBJECTIVE_SECONDS is the gauge the alert compares with."""
    gauges, reader = _gauges()
    configure(gauges, Settings(events_objective_seconds=90))
    values = _values(reader)
    assert values["expiry.events.objective"] == 90
    assert "expiry.events.pending" not in values
    assert "expiry.events.oldest_pending_age" not in values
    gauges.events_pending, gauges.oldest_pending_event_age_seconds = 12, 75.5
    values = _values(reader)
    assert (values["expiry.events.pending"], values["expiry.events.oldest_pending_age"]) == (
        12,
        75.5,
    )
    gauges.events_pending, gauges.oldest_pending_event_age_seconds = 0, 0.0
    assert _values(reader)["expiry.events.pending"] == 0
