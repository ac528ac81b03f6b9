"""Spans recorded compactly on the hot paths, built by the SDK outside them.

A job's own spans (the consumer's per delivery, the scan's and the relay's per
message) are ``RecordedSpan``: ids, parent, times, attributes, events, links and status
kept as plain values, handed on their end, as ``span_wire``'s tuple, to the export
child, which builds them as the SDK's ``ReadableSpan`` and exports them through the
SDK's public API (``span_child``); where no child exports (the console exporter, an
exporter a test gives, the in-process fallback), the tuple is built here and handed to
the span processor. What a backend receives is what the SDK's own spans gave
(``tests/unit/test_trace_identity.py``).

Sampling is the provider's sampler's, asked as the SDK's tracer asks it; a
parent-based sampler's answer for a valid parent is the parent's sampled flag (its
defaults for a parent: always on when sampled, always off when not), read without
asking. Only a sampled span records; an unsampled one is the API's
``NonRecordingSpan`` (its context carries the decision on).

The SDK's span start cost ~27 µs (its ``Span``, its attributes' cleaning, the sampler),
its end and hand-off ~17; a recorded span's start and end cost about half of that, and
the consumer's loop about half as much per job at 100% sampled (docs/benchmark.md).
Its attributes are the service's own (text, integers, booleans): they need no
cleaning. The span
limits (``OTEL_SPAN_*_LIMIT``, ``OTEL_ATTRIBUTE_*``) are applied where the span is
built (``span_wire.span_from_fields``).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, SpanProcessor, TracerProvider, sampling
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.util import types

from service.adapters.telemetry.span_export import ProcessSpanProcessor
from service.adapters.telemetry.span_wire import Ids, ids_of, span_from_fields

Sink = Callable[[tuple[Any, ...]], None]  # takes a finished span's fields (span_wire's)
Scope = tuple[str, str | None, str | None]
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def sink_for(processor: SpanProcessor, resource: Resource) -> Sink:
    """Where recorded spans go: the export child's pipe as they are; else the span is
    built here, within the span limits, and handed to ``processor``."""
    if isinstance(processor, ProcessSpanProcessor):
        return processor.record
    limits = SpanLimits()

    def build(fields: tuple[Any, ...]) -> None:
        processor.on_end(span_from_fields(fields, resource, limits))

    return build


class Recorder:
    """Starts a named scope's spans as ``RecordedSpan`` (sampled) or ``NonRecordingSpan``."""

    __slots__ = ("_ids", "_parent_based", "_sampler", "scope", "sink")

    def __init__(self, provider: TracerProvider, scope_name: str, sink: Sink) -> None:
        self._sampler = provider.sampler
        self._ids: IdGenerator = provider.id_generator
        self._parent_based = _follows_parent(self._sampler)
        self.scope: Scope = (scope_name, "", None)  # as the SDK's get_tracer(scope_name)
        self.sink = sink

    def start(
        self,
        name: str,
        kind: SpanKind,
        attributes: dict[str, Any],
        *,
        context: otel_context.Context | None = None,
        parent: trace.SpanContext | None = None,
        links: Sequence[Link] | None = None,
    ) -> trace.Span:
        """A span started now, the child of ``parent``, else of the span in ``context``
        (else in the current context), as ``Tracer.start_span`` starts it.
        ``attributes`` become the span's own (not copied)."""
        if parent is None:
            parent = trace.get_current_span(context).get_span_context()
        trace_id = parent.trace_id if parent.is_valid else self._ids.generate_trace_id()
        chosen: Mapping[str, Any] = attributes
        if parent.is_valid and self._parent_based:  # ParentBased's defaults: as the parent
            sampled, trace_state = parent.trace_flags.sampled, parent.trace_state
        else:
            if context is None and parent.is_valid:  # where the sampler reads the parent
                context = trace.set_span_in_context(trace.NonRecordingSpan(parent))
            sampled, trace_state, chosen = self._ask(
                context, trace_id, name, kind, attributes, links
            )
        span_id = self._ids.generate_span_id()
        if not sampled:
            return trace.NonRecordingSpan(
                trace.SpanContext(trace_id, span_id, False, TraceFlags(0), trace_state)
            )
        ids = (trace_id, span_id, int(_SAMPLED), False, tuple(trace_state.items()))
        parent_ids = ids_of(parent) if parent.is_valid else None
        own = chosen if chosen is attributes else dict(chosen)
        return RecordedSpan(self, name, kind, ids, parent_ids, own, links)

    def _ask(
        self,
        context: otel_context.Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind,
        attributes: dict[str, Any],
        links: Sequence[Link] | None,
    ) -> tuple[bool, trace.TraceState, Mapping[str, Any]]:
        """The sampler's answer, as the SDK's tracer asks it."""
        result = self._sampler.should_sample(context, trace_id, name, kind, attributes, links)
        state = result.trace_state if result.trace_state is not None else trace.TraceState()
        sampled = result.decision is sampling.Decision.RECORD_AND_SAMPLE
        return sampled, state, result.attributes or {}


class RecordedSpan(trace.Span):
    """A sampled span whose parts are kept as plain values until its end hands them on.

    Not thread-safe (a job's span is its own task's); ``end`` hands it on once."""

    __slots__ = (
        "_attributes",
        "_context",
        "_end",
        "_events",
        "_ids",
        "_kind",
        "_links",
        "_name",
        "_parent",
        "_recorder",
        "_start",
        "_status",
    )

    def __init__(
        self,
        recorder: Recorder,
        name: str,
        kind: SpanKind,
        ids: Ids,
        parent: Ids | None,
        attributes: dict[str, Any],
        links: Sequence[Link] | None,
    ) -> None:
        self._recorder = recorder
        self._name = name
        self._kind = kind
        self._ids = ids
        self._parent = parent
        self._attributes = attributes
        self._links = links or ()
        self._events: list[tuple[str, dict[str, Any], int]] = []
        self._status: tuple[int, str | None] = (StatusCode.UNSET.value, None)
        self._start = time.time_ns()
        self._end: int | None = None
        self._context: trace.SpanContext | None = None

    def child(
        self, name: str, kind: SpanKind, attributes: dict[str, Any], linked: Sequence[RecordedSpan]
    ) -> trace.Span:
        """A span of its recorder's started now as its child, linked to ``linked``."""
        links = [Link(span.get_span_context()) for span in linked] or None
        return self._recorder.start(
            name, kind, attributes, parent=self.get_span_context(), links=links
        )

    @property
    def traceparent(self) -> str:
        """Its W3C ``traceparent`` (version 00)."""
        trace_id, span_id, flags = self._ids[:3]
        return f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"

    def get_span_context(self) -> trace.SpanContext:
        if self._context is None:
            trace_id, span_id, flags, _, state = self._ids
            self._context = trace.SpanContext(
                trace_id, span_id, False, TraceFlags(flags), trace.TraceState(list(state))
            )
        return self._context

    def is_recording(self) -> bool:
        return self._end is None

    def set_attribute(self, key: str, value: types.AttributeValue) -> None:
        if self._end is None:
            self._attributes[key] = value

    def set_attributes(self, attributes: Mapping[str, types.AttributeValue]) -> None:
        if self._end is None:
            self._attributes.update(attributes)

    def add_event(
        self,
        name: str,
        attributes: types.Attributes = None,
        timestamp: int | None = None,
    ) -> None:
        if self._end is None:
            when = time.time_ns() if timestamp is None else timestamp
            self._events.append((name, dict(attributes or {}), when))

    def update_name(self, name: str) -> None:
        if self._end is None:
            self._name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        """As the SDK's: an OK status is final; a description is kept only with ERROR."""
        if self._end is not None or self._status[0] == StatusCode.OK.value:
            return
        if isinstance(status, Status):
            code, description = status.status_code, status.description
        else:
            code = status
        if code is StatusCode.UNSET:
            return
        self._status = (code.value, description if code is StatusCode.ERROR else None)

    def record_exception(
        self,
        exception: BaseException,
        attributes: types.Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        """The SDK's ``exception`` event (type, message, stacktrace, escaped)."""
        stacktrace = "".join(traceback.format_exception(exception))
        module = type(exception).__module__
        qualname = type(exception).__qualname__
        event: dict[str, Any] = {
            "exception.type": f"{module}.{qualname}"
            if module and module != "builtins"
            else qualname,
            "exception.message": str(exception),
            "exception.stacktrace": stacktrace,
            "exception.escaped": str(escaped),
        }
        event.update(attributes or {})
        self.add_event("exception", event, timestamp)

    def end(self, end_time: int | None = None) -> None:
        """Hand its parts on (once)."""
        if self._end is not None:
            return
        self._end = time.time_ns() if end_time is None else end_time
        self._recorder.sink(
            (
                self._name,
                self._ids,
                self._parent,
                self._attributes,
                self._events,
                [(ids_of(link.context), dict(link.attributes or {})) for link in self._links],
                self._kind.value,
                self._status,
                self._start,
                self._end,
                self._recorder.scope,
            )
        )


# What a ParentBased sampler with its defaults for a parent says of itself.
_PARENT_DEFAULTS = (
    ",remoteParentSampled:AlwaysOnSampler,remoteParentNotSampled:AlwaysOffSampler"
    ",localParentSampled:AlwaysOnSampler,localParentNotSampled:AlwaysOffSampler}"
)


def _follows_parent(sampler: sampling.Sampler) -> bool:
    """A ``ParentBased`` sampler with its defaults for a parent (every standard
    ``parentbased_*`` one): a valid parent's sampled flag is its answer."""
    if not isinstance(sampler, sampling.ParentBased):
        return False
    described: str = sampler.get_description()  # type: ignore[no-untyped-call]
    return described.endswith(_PARENT_DEFAULTS)
