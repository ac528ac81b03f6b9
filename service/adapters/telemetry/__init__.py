"""OpenTelemetry and Prometheus: log lines, traces (exported by a child process), metrics
and their instruments, and trace context read from untrusted headers.

``telemetry.<name>`` works for what commands and the runtime call; the rest is imported
from its module (``telemetry.metrics.Metrics``, ``telemetry.propagation``, ...).
"""

from service.adapters.telemetry.installed import Telemetry, telemetry_for
from service.adapters.telemetry.logs import setup_logging
from service.adapters.telemetry.meters import (
    prometheus_registry,
    serves_prometheus,
    setup_metrics,
    shutdown,
)
from service.adapters.telemetry.tracing import (
    DEFAULT_SAMPLER,
    SERVICE_NAME,
    ConsumerTracing,
    add_processor,
    consumer_tracing,
    instrument,
    recorder_for,
    recorder_of,
    resource_for,
    sampler_for,
    setup_tracing,
    traces_exporter_name,
)

__all__ = [
    "DEFAULT_SAMPLER",
    "SERVICE_NAME",
    "ConsumerTracing",
    "Telemetry",
    "add_processor",
    "consumer_tracing",
    "instrument",
    "prometheus_registry",
    "recorder_for",
    "recorder_of",
    "resource_for",
    "sampler_for",
    "serves_prometheus",
    "setup_logging",
    "setup_metrics",
    "setup_tracing",
    "shutdown",
    "telemetry_for",
    "traces_exporter_name",
]
