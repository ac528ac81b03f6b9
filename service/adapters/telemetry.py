"""Logging, tracing and metrics setup: the only place providers are configured.

Exporters follow the standard OpenTelemetry variables: traces go to OTLP when
``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (or ``OTEL_TRACES_EXPORTER=otlp``), to
stderr with ``OTEL_TRACES_EXPORTER=console``, nowhere by default; metrics are
served for Prometheus on ``EXPIRY_HTTP_PORT`` and/or pushed by OTLP.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import TracerProvider, sampling
from opentelemetry.sdk.trace.export import (
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from prometheus_client import REGISTRY
from prometheus_client.registry import CollectorRegistry

from service.adapters import propagation
from service.adapters.span_export import READY_SECONDS, otlp_processor
from service.core.redaction import might_hold_secret
from service.core.redaction import (
    redact as redact,  # re-exported: other modules import it from here
)
from service.settings import Settings

_STANDARD_ATTRS = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys() | {"message", "asctime", "taskName"}
)


def _facts(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS}


def _redacted(value: Any) -> Any:
    """``value`` with every string in it (keys too, at any depth) redacted."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {_redacted(key): _redacted(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_redacted(item) for item in value]
    return value


_JSON = json.JSONEncoder(default=str)
_REDACTING_JSON = json.JSONEncoder(default=lambda value: redact(str(value)))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, event, then the facts.

    Written for the consumer's hot path (a line per delivery): the time's
    second part is formatted once per second, the facts copied in one pass.
    """

    _second = -1
    _second_text = ""

    def format(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        if second != self._second:
            self._second = second
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        entry: dict[str, Any] = {
            "ts": f"{self._second_text}.{int(record.msecs):03d}+00:00",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS:
                entry[key] = value
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            entry["error"] = f"{type(exc).__name__}: {exc}"
        line = _JSON.encode(entry)
        # One cheap look at the whole line; the rare line that may hold a
        # secret is built again from redacted values (objects as redacted str).
        if might_hold_secret(line):
            line = _REDACTING_JSON.encode(_redacted(entry))
        return line


class TextFormatter(logging.Formatter):
    """``time level event key=value ...`` for a human at a terminal (redacted as a whole)."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created, UTC).strftime("%H:%M:%S.%f")[:-3]
        facts = " ".join(f"{k}={v}" for k, v in _facts(record).items())
        line = f"{when} {record.levelname.lower():7} {record.getMessage()} {facts}"
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            line += f" error={type(exc).__name__}: {exc}"
        return redact(line.rstrip())


class TurnHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes the lines logged in one turn of the event loop together, at its end.

    A consumer logs a line per delivery and settles hundreds in one turn: one
    write for them instead of one each. Warnings and worse, and lines logged
    outside the loop's thread, are written at once, after what waits before them.
    """

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._lines: list[str] = []
        self._scheduled = False

    def handleError(self, record: logging.LogRecord) -> None:
        """A line that could not be formatted or written: one redacted line saying so,
        never the record's raw arguments (logging's default prints them)."""
        event = record.msg if isinstance(record.msg, str) else type(record.msg).__name__
        error = sys.exc_info()[1]
        reason = type(error).__name__ if error is not None else "unknown"
        with contextlib.suppress(Exception):
            sys.stderr.write(redact(f"log line lost: {event[:100]} ({reason})") + "\n")

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:
            self.handleError(record)
            return
        self._lines.append(line)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or record.levelno >= logging.WARNING:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            loop.call_soon(self.flush)

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            self._scheduled = False
            if self._lines:
                lines, self._lines = self._lines, []
                try:
                    self.stream.write("\n".join(lines) + "\n")
                except Exception:
                    self.handleError(logging.makeLogRecord({"msg": "log write failed"}))
            super().flush()


def setup_logging(level: str, fmt: str) -> None:
    """Send log lines to stderr in the chosen format."""
    handler = TurnHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # What no line shows need not be gathered for each one (the logging HOWTO's
    # "Optimization": no caller lookup, no thread or process names).
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    root.setLevel(level)
    # Library chatter (reconnect attempts with tracebacks) stays at WARNING.
    for noisy in ("aio_pika", "aiormq"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


# -- tracing ---------------------------------------------------------------------

SERVICE_NAME = "expiry-service"


def resource_for(role: str, worker_id: str) -> Resource:
    """Our defaults, under what ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME`` say
    (they win, as the standard says; ``Resource.create`` alone would let ours win)."""
    ours = {"service.name": SERVICE_NAME, "service.instance.id": worker_id, "expiry.role": role}
    return Resource.create({**ours, **OTELResourceDetector().detect().attributes})


def traces_exporter_name(settings: Settings) -> str:
    """``otlp`` when an endpoint is set, ``console`` on request, ``none`` by default."""
    if settings.otel_sdk_disabled:
        return "none"
    if settings.otel_traces_exporter is not None:
        return settings.otel_traces_exporter
    return "otlp" if settings.otel_endpoint else "none"


DEFAULT_SAMPLER = "parentbased_always_on"  # the standard's, when OTEL_TRACES_SAMPLER is unset


def sampler_for(settings: Settings) -> sampling.Sampler:
    """``OTEL_TRACES_SAMPLER`` and ``OTEL_TRACES_SAMPLER_ARG`` as the standard reads them
    (default ``parentbased_always_on``; a ratio's default is 1.0), from the settings, so
    that a value the standard does not know stops the command at start."""
    name = settings.otel_traces_sampler or DEFAULT_SAMPLER
    ratio = 1.0 if settings.otel_traces_sampler_arg is None else settings.otel_traces_sampler_arg
    samplers: dict[str, Callable[[], sampling.Sampler]] = {
        "always_on": lambda: sampling.ALWAYS_ON,
        "always_off": lambda: sampling.ALWAYS_OFF,
        "traceidratio": lambda: sampling.TraceIdRatioBased(ratio),
        "parentbased_always_on": lambda: sampling.ParentBased(sampling.ALWAYS_ON),
        "parentbased_always_off": lambda: sampling.ParentBased(sampling.ALWAYS_OFF),
        "parentbased_traceidratio": lambda: sampling.ParentBasedTraceIdRatio(ratio),
    }
    return samplers[name]()


def tracer_for(name: str) -> trace.Tracer | None:
    """The tracer ``name``, or ``None`` when no tracing is installed (the hot paths then
    start no span at all: the consumer's per delivery, the scan's per command)."""
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return None
    return trace.get_tracer(name)


@dataclass(frozen=True)
class ConsumerTracing:
    """The consumer's tracer, and whether the head's sampling decision binds it.

    With a parent-based sampler (the standard's default) a command whose
    ``traceparent`` says "not sampled" gets no span, and the consumer learns that from
    the header alone (``propagation.unsampled``), before any tracing work.
    """

    tracer: trace.Tracer
    follows_head: bool


def consumer_tracing(settings: Settings) -> ConsumerTracing | None:
    """The consumer's tracing (``None`` when no tracing is installed)."""
    tracer = tracer_for("service.consume")
    if tracer is None:
        return None
    name = settings.otel_traces_sampler or DEFAULT_SAMPLER
    return ConsumerTracing(tracer, follows_head=name.startswith("parentbased_"))


def setup_tracing(
    settings: Settings,
    role: str,
    exporter: SpanExporter | None = None,
    *,
    export_ready: bool = False,
) -> TracerProvider | None:
    """Install the tracer provider and the aio-pika and asyncpg instrumentation.

    Nothing is installed when tracing is off, so it then costs nothing.
    ``exporter`` (tests) overrides the one the OTEL_* variables choose.
    ``export_ready`` (a long-lived process: the consumer): OTLP's export process has
    started before this returns (``span_export.READY_SECONDS`` at most, else spans are
    exported in this process).
    """
    name = traces_exporter_name(settings)
    if exporter is None and name == "none":
        return None
    resource = resource_for(role, settings.worker_id)
    provider = TracerProvider(resource=resource, sampler=sampler_for(settings))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif name == "console":
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    else:  # OTLP, encoded and sent by a process of its own (span_export.py)
        ready_seconds = READY_SECONDS if export_ready else None
        provider.add_span_processor(otlp_processor(resource, ready_seconds=ready_seconds))
    trace.set_tracer_provider(provider)
    # Trace context is read from delivery headers anyone can forge (see propagation.py).
    propagation.install()
    instrument()
    return provider


def instrument() -> None:
    """Trace aio-pika publishes (W3C context in headers) and asyncpg queries.

    Not aio-pika's consumes: its consumer span ends when the callback returns, so the
    callback would have to wait for each delivery's handling (a task and a future per
    delivery, off the batched fast path). The consumer starts and ends its own span
    per delivery instead (``service.worker.delivery``).
    """
    import aio_pika
    from opentelemetry.instrumentation.aio_pika import AioPikaInstrumentor
    from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor
    from opentelemetry.instrumentation.utils import unwrap

    if not AioPikaInstrumentor().is_instrumented_by_opentelemetry:
        AioPikaInstrumentor().instrument()
        unwrap(aio_pika.Queue, "consume")
    asyncpg_instrumentor = AsyncPGInstrumentor()  # type: ignore[no-untyped-call]
    if not asyncpg_instrumentor.is_instrumented_by_opentelemetry:
        asyncpg_instrumentor.instrument()  # statements only, never their parameters


# -- metrics ---------------------------------------------------------------------


def serves_prometheus(settings: Settings) -> bool:
    """Metrics go to Prometheus alone, through the HTTP endpoint (then the consumer's
    histograms are aggregated in the process: ``service/adapters/histograms.py``)."""
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
