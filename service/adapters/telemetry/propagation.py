"""Trace context read from headers that anyone could have forged.

The aio-pika instrumentation extracts the W3C trace context from a
delivery's headers before our callback runs; the standard propagators expect
text and raise on anything else (``traceparent: 5`` raises ``TypeError``),
which would leave the delivery unsettled. ``SafePropagator`` hands them only
short text values and turns any failure into "no context": a forged header
costs its delivery its parent span, nothing else.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.propagators.textmap import (
    CarrierT,
    Getter,
    Setter,
    TextMapPropagator,
    default_getter,
    default_setter,
)
from opentelemetry.trace import TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

log = logging.getLogger(__name__)

_W3C = TraceContextTextMapPropagator()

MAX_VALUE_LENGTH = 4096
MAX_TRACESTATE_LENGTH = 512  # the W3C limit, which the standard propagator applies
# What the standard's default propagators (tracecontext, baggage) read: of these, only
# the first two say anything of a span's parent.
W3C_FIELDS = frozenset({"traceparent", "tracestate", "baggage"})

# A W3C ``traceparent`` as the standard propagator reads it (version 00, or a later one
# with more fields): its groups are the version, the flags (bit 0: sampled), the rest.
_TRACEPARENT = re.compile(
    r"[ \t]*((?!ff)[0-9a-f]{2})-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}"
    r"-([0-9a-f]{2})(-.*)?[ \t]*"
)


def text_values(carrier: object, names: set[str]) -> dict[str, str]:
    """The carrier's ``names`` whose values are short text (bytes decoded as UTF-8)."""
    if not isinstance(carrier, Mapping):
        return {}
    found: dict[str, str] = {}
    for name in names:
        value = carrier.get(name)
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if isinstance(value, str) and len(value) <= MAX_VALUE_LENGTH:
            found[name] = value
    return found


class SafePropagator(TextMapPropagator):
    """Wraps a propagator: extraction sees only clean text and never raises."""

    def __init__(self, inner: TextMapPropagator) -> None:
        self.inner = inner
        self._fields = set(inner.fields)
        # The W3C trace context is among what it reads (``unsampled`` may look at it).
        self.reads_traceparent = "traceparent" in self._fields
        # ... and, for a span's parent, nothing else (``remote_parent`` may read it).
        self.reads_only_w3c = self.reads_traceparent and self._fields <= W3C_FIELDS

    def extract(
        self,
        carrier: CarrierT,
        context: otel_context.Context | None = None,
        getter: Getter[CarrierT] = default_getter,
    ) -> otel_context.Context:
        base = context if context is not None else otel_context.get_current()
        clean = text_values(carrier, self._fields)
        if not clean:  # nothing to read (most deliveries of an untraced publisher)
            return base
        try:
            return self.inner.extract(clean, context=base)
        except Exception:  # a value the propagator could not read: no parent, no harm
            log.debug("trace.context_unreadable")
            return base

    def inject(
        self,
        carrier: CarrierT,
        context: otel_context.Context | None = None,
        setter: Setter[CarrierT] = default_setter,
    ) -> None:
        self.inner.inject(carrier, context=context, setter=setter)

    @property
    def fields(self) -> set[str]:
        return self.inner.fields


def _read(carrier: object, name: str) -> re.Match[str] | None:
    """The carrier's header ``name`` read as a W3C ``traceparent``, if it is one."""
    # (``type() is``: the usual dict of text first, without the ABCs' checks)
    value = carrier.get(name) if type(carrier) is dict or isinstance(carrier, Mapping) else None
    if type(value) is not str:
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        elif not isinstance(value, str):
            return None
    if len(value) > MAX_VALUE_LENGTH:
        return None
    found = _TRACEPARENT.fullmatch(value)
    if found is None or (found[3] and found[1] == "00"):
        return None  # unreadable, or a version 00 with more than its four fields
    return found


def traceparent_of(carrier: object, name: str = "traceparent") -> str | None:
    """The carrier's header ``name`` when it is a well-formed W3C ``traceparent`` (a
    forged one is None): what a replay carries on as its link to the replayed job."""
    found = _read(carrier, name)
    return None if found is None else found.group(0).strip(" \t")


def link_of(carrier: object, name: str) -> trace.Link | None:
    """A link to the span the carrier's header ``name`` names, a W3C ``traceparent``
    whatever the installed propagators (None when there is no well-formed one)."""
    value = traceparent_of(carrier, name)
    if value is None:
        return None
    context = trace.get_current_span(_W3C.extract({"traceparent": value}))
    span_context = context.get_span_context()
    return trace.Link(span_context) if span_context.is_valid else None


def parent_of(traceparent: str | None) -> trace.SpanContext | None:
    """The remote span a stored W3C ``traceparent`` names (the trace an event's expiry
    ran in), to start a child span of; None when there is none or it is not well formed."""
    if traceparent is None:
        return None
    found = _read({"traceparent": traceparent}, "traceparent")
    return None if found is None else _span_context(found, None)


def unsampled(carrier: object) -> bool:
    """True when the carrier holds a well-formed ``traceparent`` whose sampled flag is off
    and the installed propagator reads it: the head of the trace decided not to sample it.

    Cheap, and builds no context: a consumer following that decision does no tracing
    work for the delivery. Anything else (no header, a forged or unreadable one, another
    propagator) is False: the delivery is read the usual way.
    """
    return unsampled_traceparent(carrier) is not None


def unsampled_traceparent(carrier: object) -> str | None:
    """The carrier's ``traceparent`` when ``unsampled`` says so (the text, as
    ``traceparent_of`` gives it), else None: what an unsampled delivery records with its
    expiry for the event's publish to carry on, at the cost of this one read."""
    textmap = propagate.get_global_textmap()
    if not isinstance(textmap, SafePropagator) or not textmap.reads_traceparent:
        return None
    found = _read(carrier, "traceparent")
    if found is None or int(found[2], 16) & 1:
        return None
    return found.group(0).strip(" \t")


class OtherPropagators(Exception):
    """The installed propagators read more than the W3C trace context: ask them."""


def remote_parent(carrier: object) -> trace.SpanContext | None:
    """The remote span the carrier's W3C ``traceparent`` (and ``tracestate``) names, as the
    standard propagator reads it, without building a context (None: no well-formed one,
    the span is a root). Raises ``OtherPropagators`` when the installed propagators read
    more than the W3C trace context (then ``propagate.extract`` is the way)."""
    textmap = propagate.get_global_textmap()
    if not isinstance(textmap, SafePropagator) or not textmap.reads_only_w3c:
        raise OtherPropagators
    found = _read(carrier, "traceparent")
    if found is None:
        return None
    state = carrier.get("tracestate") if isinstance(carrier, Mapping) else None
    if isinstance(state, bytes):
        state = state.decode("utf-8", "replace")
    return _span_context(found, state if isinstance(state, str) else None)


def _span_context(found: re.Match[str], state: str | None) -> trace.SpanContext:
    """The remote span context of a ``traceparent`` ``_read`` matched, and its
    ``tracestate`` (as the standard propagator: one too long counts as none)."""
    value = found.group(0).strip(" \t")
    if state is not None and len(state) > MAX_TRACESTATE_LENGTH:
        state = None
    return trace.SpanContext(
        int(value[3:35], 16),
        int(value[36:52], 16),
        is_remote=True,
        trace_flags=_SAMPLED if found[2] == "01" else trace.TraceFlags(int(found[2], 16)),
        trace_state=_NO_STATE if state is None else TraceState.from_header([state]),
    )


_SAMPLED = trace.TraceFlags(trace.TraceFlags.SAMPLED)
_NO_STATE = TraceState()  # immutable


def carrier_for(span: trace.Span) -> dict[str, Any]:
    """The headers that carry ``span``'s context, as ``propagate.inject`` writes them;
    with the W3C propagators alone and no baggage, written here without a context."""
    textmap = propagate.get_global_textmap()
    if isinstance(textmap, SafePropagator) and textmap.reads_only_w3c and not baggage.get_all():
        span_context = span.get_span_context()
        if not span_context.is_valid:
            return {}
        carrier: dict[str, Any] = {"traceparent": traceparent_from(span_context)}
        if span_context.trace_state:
            carrier["tracestate"] = span_context.trace_state.to_header()
        return carrier
    injected: dict[str, Any] = {}
    propagate.inject(injected, context=trace.set_span_in_context(span))
    return injected


def traceparent_from(span_context: trace.SpanContext) -> str:
    """The W3C ``traceparent`` (version 00) of a span."""
    return (
        f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}"
        f"-{int(span_context.trace_flags):02x}"
    )


def install() -> None:
    """Make the global propagator safe for untrusted carriers (idempotent)."""
    current: Any = propagate.get_global_textmap()
    if not isinstance(current, SafePropagator):
        propagate.set_global_textmap(SafePropagator(current))
