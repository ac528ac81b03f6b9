"""The consumer's histograms aggregated in the process read on /metrics exactly as the
OpenTelemetry SDK's instruments did through its Prometheus exporter."""

from __future__ import annotations

import random

import pytest
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest

from service.adapters.telemetry.metrics import DURATION_BOUNDARIES, LAG_BOUNDARIES, Metrics
from service.core.domain import Outcome

RESOURCE = Resource.create({"service.name": "expiry-service", "service.instance.id": "w1"})
FAMILIES = ("expiry_processing_duration_seconds", "expiry_lag_seconds", "expiry_claim_to_finish")


def _feed(metrics: Metrics, seed: int) -> None:
    """The same deliveries, in the same order: values on every bound, past the last, zero,
    and a random spread, over every outcome, retries and dead letters."""
    rng = random.Random(seed)
    edges = [*DURATION_BOUNDARIES, *LAG_BOUNDARIES, 0.0, 1e6]
    values = edges + [rng.expovariate(1 / rng.choice([0.01, 1, 60])) for _ in range(3000)]
    outcomes = list(Outcome)
    for index, value in enumerate(values):
        lag = None if index % 7 == 0 else value * 3
        since = None if index % 5 == 0 else value / 2
        metrics.outcome(
            outcomes[index % len(outcomes)], seconds=value, lag=lag, since_published=since
        )
        if index % 11 == 0:
            metrics.retried("db.unavailable", seconds=value)
        if index % 13 == 0:
            metrics.dead_lettered("poison.not-json", "permanent", seconds=value)
    metrics.flush()


def _text(registry: CollectorRegistry) -> list[str]:
    """The histogram families' lines of a scrape, in a stable order."""
    lines = generate_latest(registry).decode().splitlines()
    return sorted(line for line in lines if any(family in line for family in FAMILIES))


def _scraped(*, aggregated: bool, seed: int) -> list[str]:
    registry = CollectorRegistry()
    provider = MeterProvider(
        metric_readers=[PrometheusMetricReader(registry=registry)], resource=RESOURCE
    )
    metrics = Metrics(provider.get_meter("service"), prometheus=registry if aggregated else None)
    try:
        _feed(metrics, seed)
        return _text(registry)
    finally:
        metrics.close()
        provider.shutdown()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_aggregated_histograms_scrape_as_the_sdk_did(seed: int) -> None:
    """Every bucket, count, sum, label, help and type line is the same text."""
    by_sdk = _scraped(aggregated=False, seed=seed)
    assert len([line for line in by_sdk if "_bucket{" in line]) > 50
    assert _scraped(aggregated=True, seed=seed) == by_sdk


def test_nothing_is_shown_before_the_first_value_nor_after_close() -> None:
    registry = CollectorRegistry()
    provider = MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)])
    metrics = Metrics(provider.get_meter("service"), prometheus=registry)
    assert not [line for line in _text(registry) if not line.startswith("#")]
    metrics.outcome(Outcome.EXPIRED, seconds=0.004, lag=0.3, since_published=0.2)
    shown = _text(registry)
    assert 'expiry_lag_seconds_bucket{le="0.5",otel_scope_name="service",' in "\n".join(shown)
    assert any(
        line.startswith("expiry_lag_seconds_count{") and line.endswith(" 1.0") for line in shown
    )
    metrics.close()
    assert not [line for line in _text(registry) if not line.startswith("#")]
    provider.shutdown()
