"""The consumer's metrics: latencies recorded per delivery, counts added once per turn."""

from __future__ import annotations

import asyncio

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from service.adapters.telemetry.metrics import Metrics
from service.core.domain import Outcome


def _sums(reader: InMemoryMetricReader) -> dict[tuple[str, tuple[tuple[str, object], ...]], float]:
    """Every counter's value and every histogram's count, by name and attributes."""
    found: dict[tuple[str, tuple[tuple[str, object], ...]], float] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "value", None)
                    value = getattr(point, "count", None) if value is None else value
                    key = (metric.name, tuple(sorted((point.attributes or {}).items())))
                    found[key] = float(value or 0)
    return found


def _metrics() -> tuple[Metrics, InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    return Metrics(MeterProvider(metric_readers=[reader]).get_meter("test")), reader


async def test_counts_are_added_once_the_turn_ends_latencies_at_once() -> None:
    """Within a turn of the event loop the counters wait; the histograms do not."""
    metrics, reader = _metrics()
    for _ in range(3):
        metrics.outcome(Outcome.EXPIRED, seconds=0.01, lag=0.5, since_published=1.0)
    metrics.outcome(Outcome.ALREADY_DONE, seconds=0.01, lag=None)
    metrics.outcome(Outcome.NOT_ELIGIBLE, seconds=0.01, lag=None)
    now = _sums(reader)
    assert now[("expiry.processing.duration", (("outcome", "expired"),))] == 3
    assert now[("expiry.lag", ())] == 3
    assert now[("expiry.claim_to_finish", ())] == 3
    assert ("expiry.commands", (("outcome", "expired"),)) not in now
    await asyncio.sleep(0)  # the turn ends
    after = _sums(reader)
    assert after[("expiry.commands", (("outcome", "expired"),))] == 3
    assert after[("expiry.commands", (("outcome", "already-done"),))] == 1
    assert after[("expiry.commands", (("outcome", "not-eligible"),))] == 1
    assert after[("expiry.duplicate_deliveries", ())] == 1
    assert after[("expiry.state_conflicts", ())] == 1


def test_without_an_event_loop_counts_are_added_at_once() -> None:
    """Outside a loop (a script, a test) nothing waits."""
    metrics, reader = _metrics()
    metrics.outcome(Outcome.EXPIRED, seconds=0.01, lag=0.5)
    assert _sums(reader)[("expiry.commands", (("outcome", "expired"),))] == 1


async def test_flush_adds_what_waits_and_nothing_twice() -> None:
    """A flush at stop adds the last counts; the turn's own flush then adds nothing more."""
    metrics, reader = _metrics()
    metrics.outcome(Outcome.EXPIRED, seconds=0.01, lag=0.5)
    metrics.flush()
    await asyncio.sleep(0)
    assert _sums(reader)[("expiry.commands", (("outcome", "expired"),))] == 1


def test_what_retention_keeps_is_observed_per_table_and_nothing_before_it_is_read() -> None:
    """Each table's bytes, each audit table's range and reach, the last run (0: never);
    before the first read, none of them."""
    metrics, reader = _metrics()
    retention_names = {
        "expiry.table.size",
        "expiry.audit.retained_since",
        "expiry.audit.partitions_ahead",
        "expiry.retention.last_success_timestamp",
    }
    assert not {name for name, _ in _sums(reader)} & retention_names
    gauges = metrics.gauges
    gauges.table_bytes = {"reservation_transitions": 8192.0, "publish_leases": 0.0}
    gauges.retained_since = {"reservation_transitions": 1_780_000_000.0}
    gauges.partitions_ahead_seconds = {"reservation_transitions": 2_419_200.0}
    gauges.retention_last_success = 0.0
    seen = _sums(reader)
    assert seen[("expiry.table.size", (("table", "reservation_transitions"),))] == 8192
    assert seen[("expiry.table.size", (("table", "publish_leases"),))] == 0
    assert seen[("expiry.audit.retained_since", (("table", "reservation_transitions"),))] == (
        1_780_000_000
    )
    assert seen[("expiry.audit.partitions_ahead", (("table", "reservation_transitions"),))] == (
        2_419_200
    )
    assert seen[("expiry.retention.last_success_timestamp", ())] == 0
