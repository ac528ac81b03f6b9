"""One traced run, exported over OTLP as the service exports it, read back as plain data:
``python -m tests.trace_run``.

It installs tracing as ``setup_tracing`` does for a long-lived process (OTLP/HTTP,
encoded and sent by the export child) towards an in-memory OTLP receiver of its own,
then publishes commands through the scan's ``PagePublisher`` (over a channel that
confirms at once) and hands deliveries to the real ``Consumer`` over the unit tests'
fakes of the store and the broker: sampled and unsampled heads, a root, a replay, poison,
a transient failure, a suspect, a batch that falls back. It prints the spans the
receiver got as JSON, with ids and times taken out (``normalized``), so that two trees
can be compared span for span (``tests/unit/test_trace_identity.py``).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

HEAD_SAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
HEAD_UNSAMPLED = "00-1af7651916cd43dd8448eb211c80319c-c7ad6b7169203331-00"
REPLAYED = "00-2af7651916cd43dd8448eb211c80319c-d7ad6b7169203331-01"
KNOWN = {
    value.split("-")[i]: f"{name}:{'trace' if i == 1 else 'span'}"
    for name, value in (
        ("head-sampled", HEAD_SAMPLED),
        ("head-unsampled", HEAD_UNSAMPLED),
        ("replayed", REPLAYED),
    )
    for i in (1, 2)
}
WHEN = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


class Receiver(ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver that keeps what it is sent, in memory."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.bodies: list[bytes] = []
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        cast(Receiver, self.server).bodies.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return None


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def _attributes(attributes: Any) -> dict[str, Any]:
    found = {a.key: _value(a.value) for a in attributes}
    if "exception.stacktrace" in found:  # its frames' lines move with the code
        found["exception.stacktrace"] = bool(found["exception.stacktrace"])
    return dict(sorted(found.items()))


def spans_of(bodies: list[bytes]) -> Iterator[dict[str, Any]]:
    """Every span the bodies hold, as plain data (ids as hex)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    for body in bodies:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                scope = [scope_spans.scope.name, scope_spans.scope.version]
                for span in scope_spans.spans:
                    yield {
                        "resource": resource,
                        "scope": scope,
                        "name": span.name,
                        "kind": span.kind,
                        "trace": span.trace_id.hex(),
                        "id": span.span_id.hex(),
                        "parent": span.parent_span_id.hex(),
                        "trace_state": span.trace_state,
                        "flags": span.flags,
                        "attributes": _attributes(span.attributes),
                        "events": [[e.name, _attributes(e.attributes)] for e in span.events],
                        "links": [
                            [link.trace_id.hex(), link.span_id.hex(), _attributes(link.attributes)]
                            for link in span.links
                        ],
                        "status": [span.status.code, span.status.message],
                        "timed": span.end_time_unix_nano >= span.start_time_unix_nano > 0,
                    }


def normalized(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The spans with their ids replaced by names that do not depend on the run: a span
    is named by its name and its message id (or its parent's name), a trace by its root's
    name; the ids the run's headers carried keep the names ``KNOWN`` gives them."""

    def own(span: dict[str, Any]) -> str:
        return f"{span['name']}#{span['attributes'].get('messaging.message.id', '')}"

    names = {span["id"]: own(span) for span in spans}
    for span in spans:  # a batch's span is named by the delivery it is the child of
        if not span["attributes"].get("messaging.message.id") and span["parent"] in names:
            names[span["id"]] = f"{span['name']}<{names[span['parent']]}"
    roots = {span["trace"]: names[span["id"]] for span in spans if not span["parent"]}

    def name(value: str, kind: str) -> str:
        if value in KNOWN:
            return KNOWN[value]
        if not value:
            return ""
        found = names.get(value) if kind == "span" else roots.get(value)
        return found or f"unknown {kind}"

    out = []
    for span in spans:
        plain = dict(span)
        plain["id"] = names[span["id"]]
        plain["trace"] = name(span["trace"], "trace")
        plain["parent"] = name(span["parent"], "span")
        plain["links"] = [[name(t, "trace"), name(s, "span"), a] for t, s, a in span["links"]]
        out.append(plain)
    return sorted(out, key=lambda span: (span["id"], json.dumps(span, sort_keys=True)))


class _Channel:
    """An underlay channel that confirms every publish at once (no pages)."""

    async def basic_publish(self, body: bytes, **kwargs: Any) -> Any:
        from pamqp import commands as spec

        return spec.Basic.Ack()


class _Robust:
    async def get_underlay_channel(self) -> _Channel:
        return _Channel()


async def _publish() -> None:
    from service.adapters.amqp.page_publisher import Command, PagePublisher
    from service.adapters.telemetry import recorder_for

    # As the scan makes it (at 951240a, with ``tracer_for`` in place of ``recorder_for``).
    publisher = PagePublisher(_Robust(), "expirations", "expire", recorder_for("service.produce"))  # type: ignore[arg-type]
    commands = [
        Command(b"{}", "scan-root"),
        Command(b"{}", "scan-continued", HEAD_SAMPLED),
        Command(b"{}", "scan-unsampled", HEAD_UNSAMPLED),
    ]
    assert await publisher.publish(commands, timeout=5) == [None, None, None]


async def _consume() -> None:
    from service.adapters.telemetry import consumer_tracing
    from service.core.domain import command_body
    from service.settings import Settings
    from tests.unit.test_consumer import FakeMessage, new_world

    world = new_world(consumer_tracing(Settings()))
    store, batcher = world.store, world.batcher

    def command(n: int, **kwargs: Any) -> FakeMessage:
        rid = uuid.UUID(int=n)
        store.status[rid] = "held"
        return FakeMessage(command_body(rid, WHEN), message_id=f"expire:{n}", **kwargs)

    await world.deliver(command(1, headers={"traceparent": HEAD_SAMPLED}, delivery_tag=1))
    await world.deliver(command(2, headers={"traceparent": HEAD_UNSAMPLED}, delivery_tag=2))
    await world.deliver(command(3, delivery_tag=3))  # a root
    await world.deliver(
        command(
            4, headers={"traceparent": HEAD_SAMPLED, "x-expiry-replay-of": REPLAYED}, delivery_tag=4
        )
    )
    await world.deliver(FakeMessage(b'{"reservation_id": "x"}', message_id="poison"))
    await world.deliver(command(6, headers={"traceparent": HEAD_SAMPLED}, redelivered=True))
    store.fail_batches = True
    await world.deliver(command(7, headers={"traceparent": HEAD_SAMPLED}))  # alone
    store.fail_alone = OSError("transient")
    await world.deliver(command(8, headers={"traceparent": HEAD_SAMPLED}))  # retried
    # two sampled and one unsampled in one batch: one batch span, linked to the second
    store.fail_batches, store.fail_alone = False, None
    await world.deliver(
        command(9, headers={"traceparent": HEAD_SAMPLED}),
        command(10, headers={"traceparent": HEAD_UNSAMPLED}),
        command(11, headers={"traceparent": HEAD_SAMPLED}),
    )
    await batcher.close()
    assert store.status == {uuid.UUID(int=n): "expired" for n in (1, 2, 3, 4, 6, 7, 9, 10, 11)} | {
        uuid.UUID(int=8): "held"
    }, store.status


def run() -> list[dict[str, Any]]:
    """The run, its spans as the receiver got them (normalized)."""
    from opentelemetry import trace

    from service.adapters.telemetry import setup_tracing
    from service.settings import Settings

    receiver = Receiver()
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint
    os.environ["OTEL_TRACES_SAMPLER"] = "parentbased_always_on"
    os.environ["OTEL_RESOURCE_ATTRIBUTES"] = "deployment.environment=trace-run"
    settings = Settings(worker_id="trace-run")
    provider = setup_tracing(settings, "consume", export_ready=True)
    assert provider is not None
    assert trace.get_tracer_provider() is provider
    asyncio.run(_publish())
    asyncio.run(_consume())
    provider.force_flush()
    provider.shutdown()
    receiver.shutdown()
    return normalized(list(spans_of(receiver.bodies)))


if __name__ == "__main__":
    print(json.dumps(run(), indent=1, sort_keys=True))
