"""Metrics: the meter provider and its readers (Prometheus, served by the HTTP endpoint;
or OTLP, or the console), and stopping what was installed.

The instruments themselves are ``metrics.py``'s.
"""

from __future__ import annotations

import sys

from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import REGISTRY
from prometheus_client.registry import CollectorRegistry

from service.adapters.telemetry.tracing import resource_for
from service.settings import Settings


def serves_prometheus(settings: Settings) -> bool:
    """Metrics go to Prometheus alone, through the HTTP endpoint (then the consumer's
    histograms are aggregated in the process: ``histograms.py``)."""
    wanted = settings.otel_metrics_exporter
    return (
        not settings.otel_sdk_disabled
        and bool(settings.http_port)
        and wanted in (None, "prometheus")
    )


def prometheus_registry(settings: Settings) -> CollectorRegistry | None:
    """The registry a scrape reads, when Prometheus is the only reader (that is when
    ``setup_metrics`` installs its reader there)."""
    return REGISTRY if serves_prometheus(settings) else None


def setup_metrics(settings: Settings, role: str) -> MeterProvider | None:
    """Install the meter provider: Prometheus (served by the HTTP endpoint), or OTLP."""
    if settings.otel_sdk_disabled:
        return None
    readers: list[MetricReader] = []
    wanted = settings.otel_metrics_exporter
    if serves_prometheus(settings):
        from opentelemetry.exporter.prometheus import PrometheusMetricReader

        readers.append(PrometheusMetricReader())
    if wanted == "otlp":  # explicit: many trace backends (Jaeger) take no metrics
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    elif wanted == "console":
        readers.append(PeriodicExportingMetricReader(ConsoleMetricExporter(out=sys.stderr)))
    if not readers:
        return None
    provider = MeterProvider(
        metric_readers=readers, resource=resource_for(role, settings.worker_id)
    )
    metrics.set_meter_provider(provider)
    return provider


def shutdown(*providers: TracerProvider | MeterProvider | None) -> None:
    """Flush and stop what was installed."""
    for provider in providers:
        if provider is not None:
            provider.shutdown()
