"""A recorded span is what the SDK's span would have been: the same span for the same
calls (but for ids and times), the same sampling, the span limits applied where it is
built, and no cost where it is not sampled."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider, sampling
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from service.adapters.telemetry import add_processor, recorder_of
from service.adapters.telemetry.recording import RecordedSpan

PARENT = trace.SpanContext(
    0x0AF7651916CD43DD8448EB211C80319C,
    0xB7AD6B7169203331,
    is_remote=True,
    trace_flags=trace.TraceFlags(1),
    trace_state=trace.TraceState([("a", "1")]),
)
LINKED = trace.SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=trace.TraceFlags(1))


def _provider(sampler: sampling.Sampler = sampling.DEFAULT_ON) -> tuple[Any, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler, span_limits=SpanLimits())
    add_processor(provider, SimpleSpanProcessor(exporter))
    return provider, exporter


def _fail() -> None:
    raise OSError("transient")


def _work(span: trace.Span) -> None:
    """What the service does with a job's span."""
    span.set_attribute("expiry.outcome", "retry")
    span.set_attributes({"error.type": "builtins.OSError", "expiry.attempt": 2})
    span.add_event("note", {"k": "v"})
    try:
        _fail()
    except OSError as exc:
        span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, "transient"))
    span.set_status(StatusCode.UNSET)  # ignored: an error stays an error
    span.update_name("expirations process")
    span.end()
    span.set_attribute("after", "the end")  # ignored once ended
    span.end()  # ended once


def _plain(span: ReadableSpan) -> dict[str, Any]:
    assert span.context is not None
    events = [(e.name, dict(e.attributes or {})) for e in span.events]
    for _, attributes in events:  # the frames' lines differ: the two raised apart
        if "exception.stacktrace" in attributes:
            attributes["exception.stacktrace"] = "Traceback" in str(
                attributes["exception.stacktrace"]
            )
    return {
        "name": span.name,
        "kind": span.kind,
        "parent": span.parent,
        "trace": span.context.trace_id,
        "flags": span.context.trace_flags,
        "state": dict(span.context.trace_state),
        "attributes": dict(span.attributes or {}),
        "events": events,
        "links": [(link.context, dict(link.attributes or {})) for link in span.links],
        "status": (span.status.status_code, span.status.description),
        "scope": span.instrumentation_scope,
        "resource": span.resource,
        "timed": (span.end_time or 0) >= (span.start_time or 0) > 0,
    }


def test_a_recorded_span_is_the_sdk_s_span_for_the_same_calls() -> None:
    provider, exporter = _provider()
    parent = trace.set_span_in_context(trace.NonRecordingSpan(PARENT))
    attributes = {"messaging.system": "rabbitmq", "expiry.attempt": 1}
    links = [Link(LINKED, {"why": "replay"})]
    sdk = provider.get_tracer("service.consume").start_span(
        "x", parent, SpanKind.CONSUMER, dict(attributes), links
    )
    recorded = recorder_of(provider, "service.consume").start(
        "x", SpanKind.CONSUMER, dict(attributes), context=parent, links=links
    )
    assert isinstance(recorded, RecordedSpan)
    for span in (sdk, recorded):
        _work(span)
    made, built = exporter.get_finished_spans()
    assert _plain(built) == _plain(made)
    assert recorded.traceparent.split("-")[1] == f"{PARENT.trace_id:032x}"


@pytest.mark.parametrize(
    ("sampler", "parent", "sampled"),
    [
        (sampling.ParentBased(sampling.ALWAYS_OFF), PARENT, True),  # the parent decides
        (sampling.ParentBased(sampling.ALWAYS_ON), None, True),  # a root: the root sampler
        (sampling.ParentBased(sampling.ALWAYS_OFF), None, False),
        (sampling.ALWAYS_OFF, PARENT, False),  # not parent-based: it decides
        (sampling.TraceIdRatioBased(0.0), PARENT, False),
        # parent-based with other delegates than the defaults is asked
        (
            sampling.ParentBased(sampling.ALWAYS_ON, remote_parent_sampled=sampling.ALWAYS_OFF),
            PARENT,
            False,
        ),
    ],
)
def test_a_span_is_sampled_as_the_sdk_samples_it(
    sampler: sampling.Sampler, parent: trace.SpanContext | None, sampled: bool
) -> None:
    provider, exporter = _provider(sampler)
    context = None if parent is None else trace.set_span_in_context(trace.NonRecordingSpan(parent))
    sdk = provider.get_tracer("t").start_span("x", context)
    recorded = recorder_of(provider, "t").start("x", SpanKind.INTERNAL, {}, context=context)
    assert sdk.is_recording() == recorded.is_recording() == sampled
    assert isinstance(recorded, RecordedSpan) == sampled
    context_of = recorded.get_span_context()
    assert context_of.is_valid
    assert context_of.trace_flags.sampled == sampled
    if parent is not None:
        assert context_of.trace_id == parent.trace_id
    sdk.end()
    recorded.end()
    assert len(exporter.get_finished_spans()) == 2 * sampled


def test_the_span_limits_apply_where_a_recorded_span_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "4")
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "2")
    monkeypatch.setenv("OTEL_SPAN_EVENT_COUNT_LIMIT", "1")
    provider, exporter = _provider()
    sdk = provider.get_tracer("t").start_span("x", attributes={"a": "long value", "b": 1})
    recorded = recorder_of(provider, "t").start("x", SpanKind.INTERNAL, {"a": "long value", "b": 1})
    for span in (sdk, recorded):
        span.set_attribute("c", "more")
        span.add_event("first")
        span.add_event("second", {"text": "long value"})
        span.end()
    made, built = exporter.get_finished_spans()
    assert dict(built.attributes or {}) == dict(made.attributes or {}) == {"b": 1, "c": "more"}
    assert [(e.name, dict(e.attributes or {})) for e in built.events] == [
        (e.name, dict(e.attributes or {})) for e in made.events
    ]
    assert [e.name for e in built.events] == ["second"]


def test_an_ok_status_is_final_and_a_description_goes_only_with_an_error() -> None:
    provider, exporter = _provider()
    recorded = recorder_of(provider, "t").start("x", SpanKind.INTERNAL, {})
    recorded.set_status(StatusCode.OK, "kept?")
    recorded.set_status(Status(StatusCode.ERROR, "too late"))
    recorded.end()
    [span] = exporter.get_finished_spans()
    assert (span.status.status_code, span.status.description) == (StatusCode.OK, None)
