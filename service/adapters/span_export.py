"""Spans encoded and sent to OTLP by a process of their own, off the service's GIL.

Measured (docs/benchmark.md "Observability: what it costs"): the OTLP exporter's
encoding of one span (``opentelemetry-exporter-otlp-proto-common``, on protobuf's
fastest backend) costs ~50 µs and its HTTP send ~20 more, on the consumer's one
GIL; and while the export thread encodes, the event loop's thread runs slower
too. The gRPC exporter encodes with the same function; no library encodes
without the GIL. So ``ProcessSpanExporter`` hands each batch the
``BatchSpanProcessor`` gives it to a child, ``python -m
service.adapters.span_export``, as plain tuples, pickled, down a pipe (a few µs a
span); the child rebuilds them as the SDK's ``ReadableSpan`` and exports them with
the standard ``OTLPSpanExporter``: the same ``OTEL_EXPORTER_OTLP_*`` variables, the
same wire format, what a collector receives unchanged.

The child gets only what the export needs: the ``OTEL_*`` variables and the ones
that reach an HTTP endpoint (proxy, CA bundle), never the service's credentials.
It ignores SIGINT and SIGTERM, and ends when its pipe closes: at the service's
shutdown, after its last batch, or when the service dies. A child that died, or a
pipe that broke, loses spans, never work: tracing is for watching.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import IO, Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, TraceFlags, TraceState

log = logging.getLogger(__name__)

SHUTDOWN_SECONDS = 15.0  # the OTLP exporter's own timeout (10 s) and a margin
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

Context = tuple[int, int, int, bool, tuple[tuple[str, str], ...]]


def child_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The child's environment: the export's settings, never the service's secrets."""
    env = {
        name: value
        for name, value in environ.items()
        if name.startswith(CHILD_ENV_PREFIXES) or name in CHILD_ENV_NAMES
    }
    env["PYTHONPATH"] = os.pathsep.join(path for path in sys.path if path)
    return env


def _context(context: trace.SpanContext) -> Context:
    return (
        context.trace_id,
        context.span_id,
        int(context.trace_flags),
        context.is_remote,
        tuple(context.trace_state.items()),
    )


def _plain(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    """Attributes as a dict (the SDK's bounded mapping copies itself a quarter faster
    than ``dict()`` iterates it)."""
    if not attributes:
        return {}
    copy = getattr(attributes, "copy", None)
    plain = None if copy is None else copy()
    return plain if isinstance(plain, dict) else dict(attributes)


def _fields(span: ReadableSpan) -> tuple[Any, ...]:
    """A span as plain values (what the OTLP encoder reads of it)."""
    scope = span.instrumentation_scope
    status = span.status
    return (
        span.name,
        None if span.context is None else _context(span.context),
        None if span.parent is None else _context(span.parent),
        _plain(span.attributes),
        [(event.name, _plain(event.attributes), event.timestamp) for event in span.events],
        [(_context(link.context), _plain(link.attributes)) for link in span.links],
        span.kind.value,
        (status.status_code.value, status.description),
        span.start_time,
        span.end_time,
        None if scope is None else (scope.name, scope.version, scope.schema_url),
    )


def _span_context(fields: Context) -> trace.SpanContext:
    trace_id, span_id, flags, is_remote, state = fields
    return trace.SpanContext(
        trace_id, span_id, is_remote, TraceFlags(flags), TraceState(list(state))
    )


def _span(fields: Sequence[Any], resource: Resource) -> ReadableSpan:
    """The span ``_fields`` gave, rebuilt."""
    name, context, parent, attributes, events, links, kind, status, start, end, scope = fields
    code, description = status
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


def _frame(value: object) -> bytes:
    payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return len(payload).to_bytes(4, "big") + payload


def _read_frame(stream: IO[bytes]) -> Any:
    """The next value the parent sent, or None at the end of the pipe."""
    head = stream.read(4)
    if len(head) < 4:
        return None
    payload = stream.read(int.from_bytes(head, "big"))
    return pickle.loads(payload)  # the parent's own pipe: it wrote this


class ProcessSpanExporter(SpanExporter):
    """Sends spans to a child process that exports them over OTLP (see the module)."""

    def __init__(self, resource: Resource, environ: Mapping[str, str] | None = None) -> None:
        self._child = subprocess.Popen(
            [sys.executable, "-m", "service.adapters.span_export"],
            stdin=subprocess.PIPE,
            env=child_env(os.environ if environ is None else environ),
            start_new_session=True,  # a Ctrl-C in the terminal is the parent's to handle
        )
        assert self._child.stdin is not None
        self._pipe: IO[bytes] = self._child.stdin
        self._broken = False
        self._write({"resource": dict(resource.attributes), "schema_url": resource.schema_url})

    def _write(self, value: object) -> bool:
        if self._broken:
            return False
        try:
            self._pipe.write(_frame(value))
            self._pipe.flush()
        except (OSError, ValueError) as exc:  # the child is gone: spans are lost, not work
            self._broken = True
            log.warning("trace.export_process_gone", extra={"error": type(exc).__name__})
            return False
        return True

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._write([_fields(span) for span in spans]):
            return SpanExportResult.SUCCESS
        return SpanExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return not self._broken

    def shutdown(self) -> None:
        """Close the pipe and wait for the child to export what it holds."""
        with contextlib.suppress(OSError):
            self._pipe.close()
        try:
            self._child.wait(SHUTDOWN_SECONDS)
        except subprocess.TimeoutExpired:
            log.warning("trace.export_process_killed", extra={"after_s": SHUTDOWN_SECONDS})
            self._child.kill()
            self._child.wait()


def main() -> None:
    """The child: rebuild each batch the parent sends and export it over OTLP."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    stream = sys.stdin.buffer
    first = _read_frame(stream)
    if first is None:
        return
    resource = Resource(first["resource"], first["schema_url"])
    exporter = OTLPSpanExporter()
    try:
        while (batch := _read_frame(stream)) is not None:
            exporter.export([_span(fields, resource) for fields in batch])
    finally:
        exporter.shutdown()  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    main()
