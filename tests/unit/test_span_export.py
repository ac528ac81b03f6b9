"""Spans exported through the child process reach the OTLP endpoint exactly as the
standard exporter would have encoded them in the service's own process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider, sampling
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, TraceFlags, TraceState

from service.adapters.telemetry.span_export import (
    ExportProcessUnavailable,
    ProcessSpanProcessor,
    otlp_processor,
)
from service.adapters.telemetry.span_wire import child_env

RESOURCE = Resource.create({"service.name": "expiry-service", "expiry.role": "test"})


class Received:
    """What the endpoint was sent: each request's body."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.lock = threading.Lock()


@pytest.fixture
def endpoint() -> Iterator[tuple[str, Received]]:
    received = Received()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with received.lock:
                received.bodies.append(body)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", received
    server.shutdown()
    server.server_close()


def _provider(memory: InMemorySpanExporter, processor: ProcessSpanProcessor) -> TracerProvider:
    """Spans with every part the encoder reads: kinds, parents (remote too), attributes
    of each type, events, links with attributes and trace state, error status, scopes;
    ended under a provider with both processors (not shut down)."""
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("service.consume", "1.2", "https://example.test/schema")
    remote = trace.SpanContext(
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
        True,
        TraceFlags(1),
        TraceState([("vendor", "v1")]),
    )
    parent = trace.set_span_in_context(trace.NonRecordingSpan(remote))
    with tracer.start_as_current_span(
        "expirations process",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes={"a.str": "x", "a.int": 7, "a.float": 0.5, "a.bool": True, "a.list": [1, 2]},
        links=[Link(remote, {"expiry.link": "replay-of"})],
    ) as span:
        span.add_event("exception", {"exception.type": "OSError", "exception.escaped": False})
        span.set_status(Status(StatusCode.ERROR, "retried"))
        with provider.get_tracer("other").start_as_current_span("expire reservations"):
            pass
    return provider


def _request(body: bytes) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    return request


def _shipped(
    url: str, **options: float
) -> tuple[tuple[ReadableSpan, ...], ProcessSpanProcessor, TracerProvider]:
    """Spans ended under a provider with the child's processor (and the same spans, read
    by the SDK's in-memory exporter beside it)."""
    memory = InMemorySpanExporter()
    processor = ProcessSpanProcessor(
        RESOURCE,
        {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": url, "PATH": "/usr/bin:/bin"},
        **options,  # type: ignore[arg-type]
    )
    provider = _provider(memory, processor)
    return memory.get_finished_spans(), processor, provider


def test_the_child_sends_what_the_standard_exporter_encodes(
    endpoint: tuple[str, Received],
) -> None:
    url, received = endpoint
    spans, processor, provider = _shipped(url)
    provider.shutdown()  # the processor ships what is left, the child exports it
    [body] = received.bodies
    assert _request(body) == encode_spans(spans)
    assert processor.dropped == 0


def test_unsampled_spans_are_not_shipped(endpoint: tuple[str, Received]) -> None:
    url, received = endpoint
    processor = ProcessSpanProcessor(RESOURCE, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": url})
    provider = TracerProvider(resource=RESOURCE, sampler=sampling.ALWAYS_OFF)
    provider.add_span_processor(processor)
    with provider.get_tracer("t").start_as_current_span("not sampled"):
        pass
    provider.shutdown()
    assert received.bodies == []


def test_a_span_alone_is_sent_within_the_flush_interval(endpoint: tuple[str, Received]) -> None:
    url, received = endpoint
    spans, _processor, provider = _shipped(url, flush_seconds=0.2)
    deadline = time.monotonic() + 10
    while not received.bodies and time.monotonic() < deadline:
        time.sleep(0.05)
    assert received.bodies, "a span that fills no batch still goes, on the timer"
    assert _request(received.bodies[0]) == encode_spans(spans)
    provider.shutdown()


def test_a_stalled_child_never_blocks_the_span_end(endpoint: tuple[str, Received]) -> None:
    """The child stopped: the pipe fills, then what waits is bounded and the rest is
    dropped and counted; ending a span stays quick."""
    url, _received = endpoint
    processor = ProcessSpanProcessor(
        RESOURCE,
        {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": url},
        batch=10,
        max_pending_bytes=64 * 1024,
    )
    os.kill(processor._child.pid, signal.SIGSTOP)
    try:
        provider = TracerProvider(resource=RESOURCE)
        provider.add_span_processor(processor)
        tracer = provider.get_tracer("t")
        started = time.monotonic()
        for _ in range(20_000):
            with tracer.start_as_current_span("job", attributes={"a": "x" * 100}):
                pass
        assert time.monotonic() - started < 20
        assert processor.dropped > 0
    finally:
        os.kill(processor._child.pid, signal.SIGCONT)
    provider.shutdown()


def test_a_child_that_died_loses_spans_not_the_caller(endpoint: tuple[str, Received]) -> None:
    url, received = endpoint
    processor = ProcessSpanProcessor(RESOURCE, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": url}, batch=5)
    processor._child.kill()
    processor._child.wait()
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(processor)
    for _ in range(100):
        with provider.get_tracer("t").start_as_current_span("job"):
            pass
    provider.shutdown()
    assert processor.dropped > 0
    assert received.bodies == []


def test_the_child_gets_no_credentials() -> None:
    env = child_env(
        {
            "DATABASE_URL": "postgresql://u:secret@db/x",
            "AMQP_URL": "amqp://u:secret@mq/",
            "EXPIRY_CONSOLE_SECRET": "secret",
            "OTEL_EXPORTER_OTLP_HEADERS": "authorization=token",
            "HTTPS_PROXY": "http://proxy:3128",
            "PATH": "/usr/bin",
        }
    )
    assert "secret" not in " ".join(env.values())
    assert env["OTEL_EXPORTER_OTLP_HEADERS"] == "authorization=token"
    assert env["HTTPS_PROXY"] == "http://proxy:3128"


SERVICE_WITH_OTLP = """
import sys
from opentelemetry import trace
from service.adapters import telemetry
from service.settings import Settings
provider = telemetry.setup_tracing(Settings(), "consume", export_ready=sys.argv[1] == "ready")
with trace.get_tracer("t").start_as_current_span("a job"):
    pass
provider.shutdown()
"""


@pytest.mark.parametrize("start", ["ready", "beside"])
def test_a_service_with_an_otlp_endpoint_exports_through_the_child(
    endpoint: tuple[str, Received], start: str
) -> None:
    """As a command sets it up from the standard variables: the span arrives, with the
    service's resource, and the command exits when its child has sent it."""
    url, received = endpoint
    env = {
        "PATH": os.environ.get("PATH", ""),
        "DATABASE_URL": "postgresql://u:secret@db/x",
        "AMQP_URL": "amqp://u:secret@mq/",
        "OTEL_EXPORTER_OTLP_ENDPOINT": url.removesuffix("/v1/traces"),
    }
    done = subprocess.run(
        [sys.executable, "-c", SERVICE_WITH_OTLP, start], env=env, timeout=60, capture_output=True
    )
    assert done.returncode == 0, done.stderr
    [body] = received.bodies
    [resource_spans] = _request(body).resource_spans
    [span] = [s for scope in resource_spans.scope_spans for s in scope.spans]
    assert span.name == "a job"
    resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
    assert (resource["service.name"], resource["expiry.role"]) == ("expiry-service", "consume")


def test_without_a_child_the_spans_are_exported_in_process(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No process may be spawned: tracing still works, as the SDK's batch processor."""

    def refused(*_args: object, **_kwargs: object) -> None:
        raise PermissionError("spawning is not allowed here")

    monkeypatch.setattr(subprocess, "Popen", refused)
    processor = otlp_processor(RESOURCE)
    assert isinstance(processor, BatchSpanProcessor)
    assert [r.msg for r in caplog.records] == ["trace.export_process_unavailable"]
    processor.shutdown()  # type: ignore[no-untyped-call]


def _fake_child(script: str) -> list[str]:
    return [sys.executable, "-c", "import sys, time\n" + script]


def test_a_process_that_waits_for_its_child_starts_when_the_child_is_ready() -> None:
    """With ``ready_seconds`` the processor returns once the child has said so."""
    ready_after = 0.5
    started = time.monotonic()
    processor = ProcessSpanProcessor(
        RESOURCE,
        ready_seconds=30,
        command=_fake_child(
            f"time.sleep({ready_after}); sys.stdout.buffer.write(b'R'); sys.stdout.flush();"
            " sys.stdin.buffer.read()"
        ),
    )
    assert time.monotonic() - started >= ready_after
    assert processor._child.poll() is None
    processor.shutdown()
    assert processor._child.returncode == 0


@pytest.mark.parametrize(
    ("script", "why", "ready_seconds"),
    [
        ("time.sleep(60)", "did not start in time", 1.0),
        # The child's own answer decides these, not the clock: they may take as long to
        # start as a loaded machine makes them, and are known long before ready_seconds.
        ("sys.exit(3)", "exited (3)", 30.0),
        (
            "sys.stdout.buffer.write(b'?'); sys.stdout.flush(); time.sleep(60)",
            "did not say it was ready",
            30.0,
        ),
    ],
)
def test_a_child_that_does_not_say_ready_is_killed_and_named(
    script: str, why: str, ready_seconds: float
) -> None:
    started = time.monotonic()
    with pytest.raises(ExportProcessUnavailable, match=re.escape(why)):
        ProcessSpanProcessor(RESOURCE, ready_seconds=ready_seconds, command=_fake_child(script))
    assert time.monotonic() - started < 10


def test_a_child_that_cannot_start_leaves_the_export_in_process(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A consumer waits for its child: one that exits at start (here: no Python to run
    it) is known at once, and the spans are exported in the process instead."""
    monkeypatch.setattr(sys, "executable", "/bin/false")
    processor = otlp_processor(RESOURCE, ready_seconds=10)
    assert isinstance(processor, BatchSpanProcessor)
    [record] = [r for r in caplog.records if r.msg == "trace.export_process_unavailable"]
    assert record.reason == "the span export process exited (1)"  # type: ignore[attr-defined]
    processor.shutdown()  # type: ignore[no-untyped-call]
