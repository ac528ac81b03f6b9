"""Trace context read from a delivery's headers: the consumer's own reading of a
``traceparent`` (the head's sampling decision, a replay's link) agrees with the standard
propagator's, for every header a sender could write."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from opentelemetry import propagate, trace
from opentelemetry.propagators.textmap import TextMapPropagator

from service.adapters.telemetry import propagation

HEX = "0123456789abcdef"


@pytest.fixture(autouse=True)
def safe_default_propagators() -> Iterator[None]:
    """The default propagators (trace context, baggage), made safe as the service does."""
    before: TextMapPropagator = propagate.get_global_textmap()
    inner = before.inner if isinstance(before, propagation.SafePropagator) else before
    propagate.set_global_textmap(propagation.SafePropagator(inner))
    yield
    propagate.set_global_textmap(before)


def _span_context(context: Any) -> trace.SpanContext:
    return trace.get_current_span(context).get_span_context()


traceparents = st.one_of(
    st.builds(
        lambda version, trace_id, span_id, flags, rest, pad: (
            f"{pad}{version}-{trace_id}-{span_id}-{flags}{rest}{pad}"
        ),
        st.sampled_from(["00", "01", "cc", "ff", "0g", "0"]),
        st.text(HEX, min_size=32, max_size=32) | st.text(HEX, max_size=33) | st.just("0" * 32),
        st.text(HEX, min_size=16, max_size=16) | st.text(HEX, max_size=17) | st.just("0" * 16),
        st.text(HEX + "x", min_size=2, max_size=2),
        st.sampled_from(["", "-", "-extra", "-00-x"]),
        st.sampled_from(["", " ", "\t", "\n"]),
    ),
    st.text(max_size=80),
)


@given(value=traceparents, as_bytes=st.booleans())
@example(value="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", as_bytes=False)
@example(value="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00", as_bytes=False)
@example(value=" cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-02-x ", as_bytes=True)
def test_a_traceparent_reads_as_the_standard_reads_it(value: str, as_bytes: bool) -> None:
    carrier: dict[str, Any] = {"traceparent": value.encode() if as_bytes else value}
    standard = _span_context(propagate.extract(carrier))
    assert propagation.unsampled(carrier) == (
        standard.is_valid and not standard.trace_flags.sampled
    )
    assert (propagation.traceparent_of(carrier) is not None) == standard.is_valid
    link = propagation.link_of(carrier, "traceparent")
    assert (link.context if link else trace.INVALID_SPAN_CONTEXT) == standard


@given(value=traceparents)
@example(value="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
def test_a_stored_traceparent_gives_the_context_the_standard_reads(value: str) -> None:
    """An event's stored ``traceparent`` is the parent of its publish exactly when the
    standard propagator reads it as a valid context, and then the same one."""
    standard = _span_context(propagate.extract({"traceparent": value}))
    assert (propagation.parent_of(value) or trace.INVALID_SPAN_CONTEXT) == standard


def test_no_stored_traceparent_gives_no_context() -> None:
    """An event of no trace (an older writer's, an untraced job's) starts no span."""
    assert propagation.parent_of(None) is None


@given(value=traceparents, state=st.sampled_from(["", "a=1", "a=1,b=2", "x" * 600, "=bad"]))
@example(value="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", state="a=1")
def test_a_delivery_s_parent_is_the_one_the_standard_reads(value: str, state: str) -> None:
    """A consumer span's parent, read from the match the head's flag was read with, is
    the span context the standard propagator extracts, trace state included."""
    propagation.install()
    carrier: dict[str, Any] = {"traceparent": value, "tracestate": state}
    standard = _span_context(propagate.extract(carrier))
    assert (propagation.remote_parent(carrier) or trace.INVALID_SPAN_CONTEXT) == standard


def test_a_span_s_headers_are_those_the_standard_injects() -> None:
    """The publish's headers, written without a context: what ``propagate.inject``
    writes, trace state included; an invalid span writes none."""
    propagation.install()
    state = trace.TraceState([("a", "1"), ("b", "2")])
    for flags in (0, 1):
        span = trace.NonRecordingSpan(
            trace.SpanContext(0xABC, 0xDEF, False, trace.TraceFlags(flags), state)
        )
        standard: dict[str, Any] = {}
        propagate.inject(standard, context=trace.set_span_in_context(span))
        assert propagation.carrier_for(span) == standard
    assert propagation.carrier_for(trace.INVALID_SPAN) == {}
