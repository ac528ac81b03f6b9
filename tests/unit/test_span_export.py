"""Spans exported through the child process reach the OTLP endpoint exactly as the
standard exporter would have encoded them in the service's own process."""

from __future__ import annotations

import os
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
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, TraceFlags, TraceState

from service.adapters.span_export import ProcessSpanExporter, child_env

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


def _spans() -> tuple[ReadableSpan, ...]:
    """Spans with every part the encoder reads: kinds, parents (remote too), attributes
    of each type, events, links with attributes and trace state, error status, scopes."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(memory))
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
    provider.shutdown()
    return memory.get_finished_spans()


def _request(body: bytes) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    return request


def test_the_child_sends_what_the_standard_exporter_encodes(
    endpoint: tuple[str, Received],
) -> None:
    url, received = endpoint
    spans = _spans()
    exporter = ProcessSpanExporter(
        RESOURCE, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": url, "PATH": "/usr/bin:/bin"}
    )
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    exporter.shutdown()
    [body] = received.bodies
    assert _request(body) == encode_spans(spans)


def test_a_child_that_died_loses_spans_not_the_caller(endpoint: tuple[str, Received]) -> None:
    url, received = endpoint
    exporter = ProcessSpanExporter(RESOURCE, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": url})
    exporter._child.kill()
    exporter._child.wait()
    deadline = time.monotonic() + 5
    result = SpanExportResult.SUCCESS
    while result is SpanExportResult.SUCCESS and time.monotonic() < deadline:
        result = exporter.export(_spans() * 200)  # until the pipe says it is broken
    assert result is SpanExportResult.FAILURE
    exporter.shutdown()
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
from opentelemetry import trace
from service.adapters import telemetry
from service.settings import Settings
provider = telemetry.setup_tracing(Settings(), "consume")
with trace.get_tracer("t").start_as_current_span("a job"):
    pass
provider.shutdown()
"""


def test_a_service_with_an_otlp_endpoint_exports_through_the_child(
    endpoint: tuple[str, Received],
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
        [sys.executable, "-c", SERVICE_WITH_OTLP], env=env, timeout=60, capture_output=True
    )
    assert done.returncode == 0, done.stderr
    [body] = received.bodies
    [resource_spans] = _request(body).resource_spans
    [span] = [s for scope in resource_spans.scope_spans for s in scope.spans]
    assert span.name == "a job"
    resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
    assert (resource["service.name"], resource["expiry.role"]) == ("expiry-service", "consume")
