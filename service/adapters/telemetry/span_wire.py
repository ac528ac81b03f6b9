"""The spans' way to the export child: a span as plain values and back, framed on a pipe,
and what the child's environment keeps (``span_export.py`` says why a child).

``span_fields`` takes what the OTLP encoder reads of a finished span; ``span_from_fields``
rebuilds the SDK's ``ReadableSpan`` from it, so the child's export is byte for byte the
one the process would have made. A frame is a 4-byte length and a pickle: the parent's
own pipe to its own child, never anything read from outside.
"""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Mapping, Sequence
from typing import IO, Any

from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, TraceFlags, TraceState

READY = b"R"  # what the child writes on its stdout once its exporter is made
# What the child's environment keeps: the export's settings and the way to its endpoint.
CHILD_ENV_PREFIXES = ("OTEL_",)
CHILD_ENV_NAMES = frozenset(
    {
        "PATH",
        "PYTHONPATH",
        "PYTHONHOME",
        "VIRTUAL_ENV",
        "LANG",
        "LC_ALL",
        "TZ",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "no_proxy",
    }
)

Ids = tuple[int, int, int, bool, tuple[tuple[str, str], ...]]


def child_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The child's environment: the export's settings, never the service's secrets."""
    env = {
        name: value
        for name, value in environ.items()
        if name.startswith(CHILD_ENV_PREFIXES) or name in CHILD_ENV_NAMES
    }
    env["PYTHONPATH"] = os.pathsep.join(path for path in sys.path if path)
    return env


def ids_of(context: trace.SpanContext) -> Ids:
    """A span context as plain values."""
    return (
        context.trace_id,
        context.span_id,
        int(context.trace_flags),
        context.is_remote,
        tuple(context.trace_state.items()),
    )


def _plain(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    """Attributes as a dict (the SDK's bounded mapping copies itself in a quarter of the
    time ``dict()`` takes to iterate it)."""
    if not attributes:
        return {}
    copy = getattr(attributes, "copy", None)
    plain = None if copy is None else copy()
    return plain if isinstance(plain, dict) else dict(attributes)


def span_fields(span: ReadableSpan) -> tuple[Any, ...]:
    """A span as plain values (what the OTLP encoder reads of it)."""
    scope = span.instrumentation_scope
    status = span.status
    return (
        span.name,
        None if span.context is None else ids_of(span.context),
        None if span.parent is None else ids_of(span.parent),
        _plain(span.attributes),
        [(event.name, _plain(event.attributes), event.timestamp) for event in span.events],
        [(ids_of(link.context), _plain(link.attributes)) for link in span.links],
        span.kind.value,
        (status.status_code.value, status.description),
        span.start_time,
        span.end_time,
        None if scope is None else (scope.name, scope.version, scope.schema_url),
    )


def _span_context(fields: Ids) -> trace.SpanContext:
    trace_id, span_id, flags, is_remote, state = fields
    return trace.SpanContext(
        trace_id, span_id, is_remote, TraceFlags(flags), TraceState(list(state))
    )


def _bounded(
    attributes: dict[str, Any], count: int | None, length: int | None
) -> Mapping[str, Any]:
    """The attributes within the span limits, as the SDK's span bounds its own (nothing to
    do, the usual case, when they are few and no value length is limited)."""
    if length is None and (count is None or len(attributes) <= count):
        return attributes
    return BoundedAttributes(count, attributes, immutable=True, max_value_len=length)


def span_from_fields(
    fields: Sequence[Any], resource: Resource, limits: SpanLimits | None = None
) -> ReadableSpan:
    """The span ``span_fields`` (or a ``RecordedSpan``'s end) gave, built; within
    ``limits`` (the SDK's ``OTEL_SPAN_*`` and ``OTEL_ATTRIBUTE_*`` limits) when given."""
    name, context, parent, attributes, events, links, kind, status, start, end, scope = fields
    code, description = status
    if limits is not None:
        attributes = _bounded(
            attributes, limits.max_span_attributes, limits.max_span_attribute_length
        )
        if limits.max_events is not None:  # the SDK keeps the latest
            events = events[-limits.max_events :] if limits.max_events else []
        events = [
            (n, _bounded(a, limits.max_event_attributes, limits.max_attribute_length), t)
            for n, a, t in events
        ]
        if limits.max_links is not None:
            links = links[-limits.max_links :] if limits.max_links else []
    return ReadableSpan(
        name=name,
        context=None if context is None else _span_context(context),
        parent=None if parent is None else _span_context(parent),
        resource=resource,
        attributes=attributes,
        events=[Event(n, a, t) for n, a, t in events],
        links=[Link(_span_context(c), a) for c, a in links],
        kind=SpanKind(kind),
        status=Status(StatusCode(code), description),
        start_time=start,
        end_time=end,
        instrumentation_scope=None if scope is None else InstrumentationScope(*scope),
    )


def frame(value: object) -> bytes:
    payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return len(payload).to_bytes(4, "big") + payload


def read_frame(stream: IO[bytes]) -> Any:
    """The next value the parent sent, or None at the end of the pipe."""
    head = stream.read(4)
    if len(head) < 4:
        return None
    size = int.from_bytes(head, "big")
    payload = stream.read(size)
    if len(payload) < size:
        return None  # the parent died mid-frame
    return pickle.loads(payload)  # the parent's own pipe: it wrote this
