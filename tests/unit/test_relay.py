"""The relay's pieces that need no server: its pauses after failures, its health, its
test-only exit point, and its metrics as Prometheus shows them."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry, generate_latest

from service.adapters.telemetry.relay_metrics import UNROUTABLE, RelayMetrics
from service.relay import exit_points
from service.relay.ledger import Batch
from service.relay.pump import PAUSE_MAX_SECONDS, PumpHealth, _pause_after
from service.settings import Settings


def test_the_pause_after_failures_doubles_from_one_second_up_to_its_cap() -> None:
    """1, 2, 4, 8, 16 s after failures in a row, then the cap; none before a failure."""
    pauses = [_pause_after(n) for n in range(1, 9)]
    assert pauses == [1, 2, 4, 8, 16, 30, 30, 30]
    assert max(pauses) == PAUSE_MAX_SECONDS


def test_a_batch_with_an_event_not_published_is_a_failed_one() -> None:
    """Unroutable or unconfirmed events make the relay pause; a clean batch does not."""
    assert not Batch(claimed=5, published=5, marked=5).failed
    assert Batch(claimed=5, unroutable=5).failed
    assert Batch(claimed=5, published=4, unconfirmed=1).failed


def test_the_relay_is_ready_while_its_looks_succeed_within_the_stall_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ready at its start; not after a failed look; again after a good one; not once no
    look succeeded for longer than the bound."""
    clock = [100.0]
    monkeypatch.setattr("service.relay.pump.time.monotonic", lambda: clock[0])
    health = PumpHealth(stall_seconds=10)
    assert health.draining()
    health.last_ok = False
    assert not health.draining()
    health.succeeded()
    clock[0] += 9
    assert health.draining()
    clock[0] += 2
    assert not health.draining()


def test_the_exit_point_is_only_the_relays_own() -> None:
    """``exit-after-publish`` arms the relay's exit; no setting, or the consumer's
    failpoints, arm nothing."""
    assert isinstance(exit_points.exits_for("exit-after-publish"), exit_points.ExitAfterPublish)
    for spec in ("", "exit-after-commit", "exit-on:0f8fad5b-d9cb-469f-a165-70867728950e"):
        assert exit_points.exits_for(spec) is exit_points.NO_EXITS
    exit_points.NO_EXITS.after_publish()  # does nothing


def test_the_failpoint_setting_accepts_the_relays_exit() -> None:
    """EXPIRY_FAILPOINT=exit-after-publish is a valid setting."""
    assert Settings(failpoint="exit-after-publish").failpoint == "exit-after-publish"


def test_the_relays_metrics_count_what_it_did() -> None:
    """A batch, refused events and lost marks: the counters and gauges the SDK reads, and
    the histograms aggregated in the process as Prometheus shows them."""
    registry = CollectorRegistry()
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    metrics = RelayMetrics(provider.get_meter("service"), prometheus=registry)
    metrics.is_listening = lambda: True
    metrics.batch(seconds=0.02, committed_at=[99.5, 99.9], republished=1, confirmed_at=100.0)
    metrics.refused(UNROUTABLE, 3)
    metrics.lost_marks(2)
    data = reader.get_metrics_data()
    assert data is not None
    points = {
        metric.name: sum(getattr(p, "value", 0) for p in metric.data.data_points)
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    assert points["expiry.relay.published"] == 2
    assert points["expiry.relay.republished"] == 1
    assert points["expiry.relay.unpublished"] == 3
    assert points["expiry.relay.marks_lost"] == 2
    assert points["expiry.relay.listening"] == 1
    assert points["expiry.relay.last_success_timestamp"] > 0
    shown = generate_latest(registry).decode()
    assert "expiry_event_commit_to_confirm_seconds_count" in shown
    assert "expiry_relay_batch_duration_seconds_count" in shown
    metrics.close()
    assert generate_latest(registry).decode() == ""
    provider.shutdown()
