"""The scanner's health and its per-pass metrics (``service/scan/every.py``), no I/O."""

from __future__ import annotations

import time

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from service.adapters.telemetry.metrics import ScanMetrics
from service.scan import ScanResult
from service.scan.every import FAILED, OK, STOPPED, ScanHealth, Scanner


def scanner() -> tuple[Scanner, InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    metrics = ScanMetrics(MeterProvider(metric_readers=[reader]).get_meter("t"), interval_seconds=5)
    return Scanner(metrics, ScanHealth(stall_seconds=20)), reader


def points(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, object], object]]]:
    found: dict[str, list[tuple[dict[str, object], object]]] = {}
    data = reader.get_metrics_data()
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "value", getattr(point, "count", None))
                    found.setdefault(metric.name, []).append((dict(point.attributes or {}), value))
    return found


def test_a_starting_scanner_is_healthy_a_failing_one_is_not_until_a_pass_succeeds() -> None:
    """Healthy while its passes succeed: a failed pass turns it unhealthy, a good one back."""
    watch, _ = scanner()
    assert watch.health.healthy()
    watch.ended(ScanResult(), FAILED, 0.1)
    assert watch.health.checks() == {"last_pass_ok": False, "progressing": True}
    assert not watch.health.healthy()
    watch.ended(ScanResult(), STOPPED, 0.1)  # a stopped pass says nothing either way
    assert not watch.health.healthy()
    watch.ended(ScanResult(published=3), OK, 0.1)
    assert watch.health.healthy()


def test_a_pass_that_stalls_turns_it_unhealthy_one_that_progresses_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A long pass stays healthy while it records pages; a stuck one does not."""
    watch, _ = scanner()
    now = time.monotonic()
    watch.health.current = ScanResult(progressed_at=now)
    monkeypatch.setattr(time, "monotonic", lambda: now + 15)
    assert watch.health.healthy()
    watch.health.current.progressed_at = now + 14
    monkeypatch.setattr(time, "monotonic", lambda: now + 30)
    assert watch.health.healthy()  # 16 s since its last page
    monkeypatch.setattr(time, "monotonic", lambda: now + 40)
    assert watch.health.checks() == {"last_pass_ok": True, "progressing": False}


def test_each_pass_is_counted_with_what_it_published_and_the_leases_that_lapsed() -> None:
    """Passes by result, published, unconfirmed and lapsed counts, the last success time."""
    watch, reader = scanner()
    assert "expiry.scan.last_success_timestamp" not in points(reader)
    watch.ended(ScanResult(published=10, failed=2, lapsed=1), FAILED, 0.5)
    watch.ended(ScanResult(published=5, lapsed=2), OK, 0.2)
    found = points(reader)
    assert sorted((a["result"], v) for a, v in found["expiry.scan.passes"]) == [
        ("failed", 1),
        ("ok", 1),
    ]
    assert found["expiry.scan.published"] == [({}, 15)]
    assert found["expiry.scan.unconfirmed"] == [({}, 2)]
    assert found["expiry.scan.leases_lapsed"] == [({}, 3)]
    [(_, last)] = found["expiry.scan.last_success_timestamp"]
    assert abs(float(str(last)) - time.time()) < 5
    assert found["expiry.scan.interval"] == [({}, 5)]
