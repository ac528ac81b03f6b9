"""Tracing: the tracer provider, its sampler and resource, and the libraries' spans.

The only place a tracer provider is configured. Traces go to OTLP when
``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (or ``OTEL_TRACES_EXPORTER=otlp``), encoded and
sent by a child process (``span_export.py``); to stderr with
``OTEL_TRACES_EXPORTER=console``; nowhere by default, at no cost. A job's own spans are
recorded compactly and built as the SDK's outside the hot path (``recording.py``); the
processor added here (``add_processor``) is where they go.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider, sampling
from opentelemetry.sdk.trace.export import (
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)

from service.adapters.telemetry import propagation
from service.adapters.telemetry.recording import Recorder, Sink, sink_for
from service.adapters.telemetry.span_export import READY_SECONDS, otlp_processor
from service.settings import Settings

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


_SINKS: dict[int, tuple[TracerProvider, Sink]] = {}  # by provider: where recorded spans go


def add_processor(provider: TracerProvider, processor: SpanProcessor) -> None:
    """Add ``processor`` to ``provider``; recorded spans (``recording``) go to it too."""
    provider.add_span_processor(processor)
    _SINKS[id(provider)] = (provider, sink_for(processor, provider.resource))


def recorder_of(provider: TracerProvider, name: str) -> Recorder:
    """Scope ``name``'s recorder of spans, for ``provider`` (one ``add_processor`` made)."""
    return Recorder(provider, name, _SINKS[id(provider)][1])


def recorder_for(name: str) -> Recorder | None:
    """Scope ``name``'s recorder for the installed provider, or ``None`` when no tracing
    is installed (the hot paths then start no span at all: the consumer's per delivery,
    the scan's and the relay's per message)."""
    provider = trace.get_tracer_provider()
    found = _SINKS.get(id(provider))
    if found is None or found[0] is not provider:
        return None
    return Recorder(provider, name, found[1])


@dataclass(frozen=True)
class ConsumerTracing:
    """The consumer's recorder of spans, and whether the head's sampling decision binds it.

    With a parent-based sampler (the standard's default) a command whose
    ``traceparent`` says "not sampled" gets no span, and the consumer learns that from
    the header alone (``propagation.unsampled``), before any tracing work.
    """

    recorder: Recorder
    follows_head: bool


def consumer_tracing(settings: Settings) -> ConsumerTracing | None:
    """The consumer's tracing (``None`` when no tracing is installed)."""
    recorder = recorder_for("service.consume")
    if recorder is None:
        return None
    return ConsumerTracing(recorder, follows_head=follows_head(settings))


def follows_head(settings: Settings) -> bool:
    """Whether the sampler is parent-based (the standard's default): then a parent that
    says "not sampled" decides for its children, read from its ``traceparent`` alone."""
    return (settings.otel_traces_sampler or DEFAULT_SAMPLER).startswith("parentbased_")


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
        add_processor(provider, SimpleSpanProcessor(exporter))
    elif name == "console":
        add_processor(provider, SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    else:  # OTLP, encoded and sent by a process of its own (span_export.py)
        ready_seconds = READY_SECONDS if export_ready else None
        add_processor(provider, otlp_processor(resource, ready_seconds=ready_seconds))
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
