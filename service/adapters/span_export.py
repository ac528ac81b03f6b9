"""Spans encoded and sent to OTLP by a process of their own, off the service's GIL.

Measured (docs/benchmark.md "Observability: what it costs"): the OTLP exporter's
encoding of one span (``opentelemetry-exporter-otlp-proto-common``, on protobuf's
fastest backend) costs ~50 µs, and with its HTTP send ~90 µs in all, on the
consumer's one GIL; and while the SDK's export thread works, the event loop's thread runs slower
too (they take the GIL from each other). The gRPC exporter encodes with the same
function; no library encodes without the GIL. So ``ProcessSpanProcessor`` hands
the sampled spans, in batches, to a child, ``python -m
service.adapters.span_export``, as plain tuples, pickled, down a pipe it never
waits on (~17 µs a span, in the thread that ended it: there is no export thread);
the child rebuilds them as the SDK's ``ReadableSpan`` and exports them with the
standard ``OTLPSpanExporter``: the same ``OTEL_EXPORTER_OTLP_*`` variables, the
same wire format, what a collector receives unchanged.

The child gets only what the export needs: the ``OTEL_*`` variables and the ones
that reach an HTTP endpoint (proxy, CA bundle), never the service's credentials.
It ignores SIGINT and SIGTERM, and ends when its pipe closes: at the service's
shutdown, after its last batch, or when the service dies. A child that died, or a
pipe that broke, loses spans, never work: tracing is for watching.

The child says it is ready (a byte on its stdout) once its exporter is made. A
long-lived process (the consumer) waits for that before it starts its work: the
child's start (its imports, ~0.3 s of CPU) is then not taken from the first
deliveries, and a child that cannot start is known at once, and replaced by the
SDK's batch processor in the process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import IO, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, TraceFlags, TraceState

log = logging.getLogger(__name__)

SHUTDOWN_SECONDS = 15.0  # the OTLP exporter's own timeout (10 s) and a margin
READY_SECONDS = 10.0  # how long a process that waits for its child's start waits
READY = b"R"  # what the child writes on its stdout once its exporter is made
BATCH_SPANS = 128  # spans written to the pipe together
FLUSH_SECONDS = 1.0  # a span waits at most about this long for its batch
MAX_PENDING_BYTES = 8 * 1024 * 1024  # what waits for a busy child (~60,000 spans)
DROP_WARNING_SECONDS = 60.0
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


def _context(context: trace.SpanContext) -> Ids:
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


def _span_context(fields: Ids) -> trace.SpanContext:
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
    size = int.from_bytes(head, "big")
    payload = stream.read(size)
    if len(payload) < size:
        return None  # the parent died mid-frame
    return pickle.loads(payload)  # the parent's own pipe: it wrote this


class ProcessSpanProcessor(SpanProcessor):
    """Ships each sampled span, once ended, to a child that exports it over OTLP (see
    the module), from the thread that ended it: no export thread contends for the GIL.

    Spans are gathered into batches of ``batch`` (or shipped after ``flush_seconds``
    by a timer thread that wakes that often), each batch turned into plain values and
    written to the pipe without blocking: what the pipe cannot take now waits, up to
    ``max_pending_bytes``; a batch beyond that is dropped and counted (``dropped``),
    as the SDK's batch processor drops spans when its queue is full. The span's end
    never waits for the child.
    """

    def __init__(
        self,
        resource: Resource,
        environ: Mapping[str, str] | None = None,
        *,
        batch: int = BATCH_SPANS,
        flush_seconds: float = FLUSH_SECONDS,
        max_pending_bytes: int = MAX_PENDING_BYTES,
        ready_seconds: float | None = None,
        command: Sequence[str] | None = None,
    ) -> None:
        """``ready_seconds``: wait that long at most for the child to say it is ready,
        else kill it and raise ``ExportProcessUnavailable`` (None: do not wait).
        ``command``: the child's (tests), by default this module's ``main``."""
        self._child = subprocess.Popen(
            [sys.executable, "-m", "service.adapters.span_export"]
            if command is None
            else list(command),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,  # the child's "ready", and nothing else
            env=child_env(os.environ if environ is None else environ),
            start_new_session=True,  # a Ctrl-C in the terminal is the parent's to handle
        )
        assert self._child.stdin is not None
        assert self._child.stdout is not None
        self._pipe: IO[bytes] = self._child.stdin
        self._said: IO[bytes] = self._child.stdout  # the child's "ready"
        self._fd = self._pipe.fileno()
        os.set_blocking(self._fd, False)
        self._batch = batch
        self._max_pending = max_pending_bytes
        self._lock = threading.Lock()
        self._spans: list[ReadableSpan] = []
        self._pending: deque[memoryview] = deque()  # frames the pipe has not taken yet
        self._pending_bytes = 0
        self._closed = False
        self.dropped = 0  # spans lost: the pipe was full, or the child gone
        self._next_warning = 0.0
        self._queue_frame(
            _frame({"resource": dict(resource.attributes), "schema_url": resource.schema_url}), 0
        )
        self._drain()  # the child reads the resource before it makes its exporter
        if ready_seconds is not None:
            self._wait_ready(ready_seconds)
        self._stop = threading.Event()
        self._timer = threading.Thread(
            target=self._tick, args=(flush_seconds,), name="span-export", daemon=True
        )
        self._timer.start()

    def _wait_ready(self, seconds: float) -> None:
        readable, _, _ = select.select([self._said], [], [], seconds)
        said = os.read(self._said.fileno(), 1) if readable else b""
        if said == READY:
            return
        self._child.kill()
        self._child.wait()
        self._pipe.close()
        self._said.close()
        if not readable:
            why = "did not start in time"
        elif said:
            why = "did not say it was ready"
        else:
            why = f"exited ({self._child.returncode})"
        raise ExportProcessUnavailable(f"the span export process {why}")

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        context = span.context
        if context is None or not context.trace_flags.sampled:
            return
        with self._lock:
            if self._closed:
                self.dropped += 1
                return
            self._spans.append(span)
            if len(self._spans) >= self._batch:
                self._ship()

    def _tick(self, seconds: float) -> None:
        while not self._stop.wait(seconds):
            with self._lock:
                if not self._closed:
                    self._ship()

    def _ship(self) -> None:
        """Turn the gathered spans into a frame and write what the pipe takes (locked)."""
        spans, self._spans = self._spans, []
        if spans:
            self._queue_frame(_frame([_fields(span) for span in spans]), len(spans))
        self._drain()

    def _queue_frame(self, frame: bytes, spans: int) -> None:
        if self._pending_bytes + len(frame) > self._max_pending:
            self.dropped += spans
            now = time.monotonic()
            if now >= self._next_warning:  # the first drop, then at most once a minute
                self._next_warning = now + DROP_WARNING_SECONDS
                log.warning(
                    "trace.spans_dropped",
                    extra={"dropped_total": self.dropped, "pending_bytes": self._pending_bytes},
                )
            return
        self._pending.append(memoryview(frame))
        self._pending_bytes += len(frame)

    def _drain(self) -> None:
        while self._pending:
            head = self._pending[0]
            try:
                written = os.write(self._fd, head)
            except BlockingIOError:
                return  # the child is busy: the rest waits for the next ship
            except OSError as exc:  # the child is gone: what waits is lost, never work
                self._lost(exc)
                return
            self._pending_bytes -= written
            if written == len(head):
                self._pending.popleft()
            else:
                self._pending[0] = head[written:]

    def _lost(self, exc: BaseException) -> None:
        if not self._closed:
            log.warning("trace.export_process_gone", extra={"error": type(exc).__name__})
        self._closed = True
        self._pending.clear()
        self._pending_bytes = 0

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Write every span ended so far to the pipe, waiting for it at most the timeout."""
        return self._flush(time.monotonic() + timeout_millis / 1000)

    def _flush(self, deadline: float) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._ship()
            while self._pending and time.monotonic() < deadline:
                select.select([], [self._fd], [], max(0.0, deadline - time.monotonic()))
                self._drain()
            return not self._pending

    def shutdown(self) -> None:
        """Write what is left, close the pipe, and wait for the child to export it: all
        within ``SHUTDOWN_SECONDS``, then the child is killed."""
        deadline = time.monotonic() + SHUTDOWN_SECONDS
        self._stop.set()
        self._flush(deadline)
        with self._lock:
            self._closed = True
            with contextlib.suppress(OSError):
                self._pipe.close()
        try:
            self._child.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("trace.export_process_killed", extra={"after_s": SHUTDOWN_SECONDS})
            self._child.kill()
            self._child.wait()
        self._said.close()


class ExportProcessUnavailable(OSError):
    """The export child exited or stayed silent before it said it was ready."""


def otlp_processor(resource: Resource, *, ready_seconds: float | None = None) -> SpanProcessor:
    """The OTLP span processor: the child's, or, if no child can be started (no
    process may be spawned here, say, or, with ``ready_seconds``, it did not say it
    was ready in time), the SDK's batch processor in this process, as before the child
    existed (said once, at start)."""
    try:
        return ProcessSpanProcessor(resource, ready_seconds=ready_seconds)
    except OSError as exc:
        log.warning(
            "trace.export_process_unavailable",
            extra={"error": type(exc).__name__, "reason": str(exc)},
        )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    return BatchSpanProcessor(OTLPSpanExporter())


def _say_ready() -> None:
    """Write ``READY`` on stdout, then point stdout at /dev/null (it is the parent's
    pipe, which a parent that does not wait never reads)."""
    with contextlib.suppress(OSError):  # a parent that closed it does not wait
        os.write(1, READY)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


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
    _say_ready()
    try:
        while (batch := _read_frame(stream)) is not None:
            exporter.export([_span(fields, resource) for fields in batch])
    finally:
        exporter.shutdown()  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    main()
