"""Spans encoded and sent to OTLP by a process of their own, off the service's GIL.

Measured (docs/benchmark.md "Observability: what it costs"): the OTLP exporter's
encoding of one span (``opentelemetry-exporter-otlp-proto-common``, on protobuf's
fastest backend) costs ~50 µs, and with its HTTP send ~90 µs in all, on the
consumer's one GIL; and while the SDK's export thread works, the event loop's thread runs slower
too (they take the GIL from each other). The gRPC exporter encodes with the same
function; no library encodes without the GIL. So ``ProcessSpanProcessor`` hands
the sampled spans, in batches, to a child, ``python -m
service.adapters.telemetry.span_child``, as plain tuples, pickled, down a pipe it never
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
import select
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import IO, Any

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from service.adapters.telemetry.span_wire import READY, child_env, frame, span_fields

log = logging.getLogger(__name__)

SHUTDOWN_SECONDS = 15.0  # the OTLP exporter's own timeout (10 s) and a margin
READY_SECONDS = 10.0  # how long a process that waits for its child's start waits
BATCH_SPANS = 128  # spans written to the pipe together
FLUSH_SECONDS = 1.0  # a span waits at most about this long for its batch
MAX_PENDING_BYTES = 8 * 1024 * 1024  # what waits for a busy child (~60,000 spans)
DROP_WARNING_SECONDS = 60.0


class FramePipe:
    """Frames written to a child's pipe without ever blocking: what the pipe cannot take
    now waits, up to ``max_pending`` bytes; a frame beyond that is dropped and its spans
    counted (``dropped``). A pipe that broke (the child is gone) drops what waits and all
    that comes after: spans are lost, never work. Not thread-safe: its owner locks."""

    def __init__(self, fd: int, max_pending: int) -> None:
        self._fd = fd
        os.set_blocking(fd, False)
        self._max_pending = max_pending
        self._pending: deque[memoryview] = deque()  # frames the pipe has not taken yet
        self._pending_bytes = 0
        self.broken = False
        self.dropped = 0  # spans lost: the pipe was full, or the child gone
        self._next_warning = 0.0

    @property
    def waiting(self) -> bool:
        """Some frame waits for the pipe."""
        return bool(self._pending)

    def put(self, data: bytes, spans: int) -> None:
        """Queue a frame of ``spans`` spans (dropped and counted if too much waits)."""
        if self.broken or self._pending_bytes + len(data) > self._max_pending:
            self.dropped += spans
            now = time.monotonic()
            if not self.broken and now >= self._next_warning:  # then once a minute at most
                self._next_warning = now + DROP_WARNING_SECONDS
                log.warning(
                    "trace.spans_dropped",
                    extra={"dropped_total": self.dropped, "pending_bytes": self._pending_bytes},
                )
            return
        self._pending.append(memoryview(data))
        self._pending_bytes += len(data)

    def drain(self) -> None:
        """Write what the pipe takes now."""
        while self._pending:
            head = self._pending[0]
            try:
                written = os.write(self._fd, head)
            except BlockingIOError:
                return  # the child is busy: the rest waits for the next drain
            except OSError as exc:  # the child is gone: what waits is lost, never work
                if not self.broken:
                    log.warning("trace.export_process_gone", extra={"error": type(exc).__name__})
                self.broken = True
                self._pending.clear()
                self._pending_bytes = 0
                return
            self._pending_bytes -= written
            if written == len(head):
                self._pending.popleft()
            else:
                self._pending[0] = head[written:]

    def drain_until(self, deadline: float) -> bool:
        """Wait for the pipe until everything is written or ``deadline`` (monotonic);
        whether everything was."""
        self.drain()
        while self._pending and time.monotonic() < deadline:
            select.select([], [self._fd], [], max(0.0, deadline - time.monotonic()))
            self.drain()
        return not self._pending


class ProcessSpanProcessor(SpanProcessor):
    """Ships each sampled span, once ended, to a child that exports it over OTLP (see
    the module), from the thread that ended it: no export thread contends for the GIL.

    Spans are gathered into batches of ``batch`` (or shipped after ``flush_seconds``
    by a timer thread that wakes that often), each batch turned into plain values and
    written to the pipe without blocking (``FramePipe``: up to ``max_pending_bytes``
    wait, beyond that a batch is dropped and counted, as the SDK's batch processor drops
    spans when its queue is full). The span's end never waits for the child.
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
        ``command``: the child's (tests), by default ``span_child``'s."""
        self._child = subprocess.Popen(
            [sys.executable, "-m", "service.adapters.telemetry.span_child"]
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
        self._out = FramePipe(self._pipe.fileno(), max_pending_bytes)
        self._batch = batch
        self._lock = threading.Lock()
        self._spans: list[tuple[Any, ...]] = []  # span_wire's fields, of each span
        self._closed = False
        self._out.put(
            frame({"resource": dict(resource.attributes), "schema_url": resource.schema_url}), 0
        )
        self._out.drain()  # the child reads the resource before it makes its exporter
        if ready_seconds is not None:
            self._wait_ready(ready_seconds)
        self._stop = threading.Event()
        self._timer = threading.Thread(
            target=self._tick, args=(flush_seconds,), name="span-export", daemon=True
        )
        self._timer.start()

    @property
    def dropped(self) -> int:
        """Spans lost: the pipe was full, the child gone, or the processor shut down."""
        return self._out.dropped

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
        self.record(span_fields(span))

    def record(self, fields: tuple[Any, ...]) -> None:
        """Take a sampled span as ``span_wire``'s fields (a ``RecordedSpan``'s end hands
        them here: the SDK's span is built in the child)."""
        with self._lock:
            if self._closed or self._out.broken:
                self._out.dropped += 1
                return
            self._spans.append(fields)
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
            self._out.put(frame(spans), len(spans))
        self._out.drain()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Write every span ended so far to the pipe, waiting for it at most the timeout."""
        return self._flush(time.monotonic() + timeout_millis / 1000)

    def _flush(self, deadline: float) -> bool:
        with self._lock:
            if self._closed or self._out.broken:
                return False
            self._ship()
            return self._out.drain_until(deadline)

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
