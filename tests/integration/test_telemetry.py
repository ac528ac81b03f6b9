"""Traces, metrics and the health endpoint, against the real services."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from service import scan
from service.adapters import telemetry
from service.adapters.telemetry.metrics import Metrics
from service.core.domain import command_body
from tests.recipes import consumer_cut_off, database_behind_proxy
from tests.support import (
    Stack,
    eventually,
    free_port,
    insert_holds,
    pg_connection,
    publish_raw,
    queue_depth,
    run_module,
    running_consumer,
    stack_settings,
    statuses,
    until_ready,
    wait_for_consumers,
)

pytestmark = pytest.mark.integration


# The tracer provider can be set once per process, and a worker process (pytest-xdist,
# --dist worksteal) may run this module's tests between others', setting the fixture up
# more than once: one exporter per process, the instrumentation on only around its tests.
_EXPORTER = InMemorySpanExporter()
_INSTALLED: list[object] = []  # the provider set up with _EXPORTER, once per process


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on, into memory, for this module's tests only (the provider is process-wide)."""
    from opentelemetry import trace
    from opentelemetry.instrumentation.aio_pika import AioPikaInstrumentor
    from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor

    if _INSTALLED:
        telemetry.tracing.instrument()  # set up before in this process, uninstrumented since
    else:
        settings = stack_settings("postgresql://x@h/d", "amqp://h/")
        _INSTALLED.append(telemetry.setup_tracing(settings, "test", _EXPORTER))
    assert trace.get_tracer_provider() is _INSTALLED[0], "another tracer provider is set"
    _EXPORTER.clear()
    yield _EXPORTER
    AioPikaInstrumentor().uninstrument()
    AsyncPGInstrumentor().uninstrument()  # type: ignore[no-untyped-call]
    _EXPORTER.clear()


def _by_id(all_spans: tuple[ReadableSpan, ...]) -> dict[int, ReadableSpan]:
    return {s.context.span_id: s for s in all_spans if s.context is not None}


def _ancestors(span: ReadableSpan, index: dict[int, ReadableSpan]) -> list[ReadableSpan]:
    chain = []
    while span.parent is not None and span.parent.span_id in index:
        span = index[span.parent.span_id]
        chain.append(span)
    return chain


async def _expired(stack: Stack, count: int) -> bool:
    return (await statuses(stack.database_url)).get("expired", 0) == count


async def test_one_trace_links_the_scan_the_consumer_and_the_database(
    stack: Stack, spans: InMemorySpanExporter
) -> None:
    """The scan's publish span and the consumer's span share a trace; the update is a child."""
    spans.clear()
    [rid] = await insert_holds(stack.database_url, 1)
    async with running_consumer(stack.settings) as task:
        await wait_for_consumers(stack.amqp_url, 1, task)
        await scan.scan_once(stack.settings)
        await eventually(lambda: _expired(stack, 1))
    finished = spans.get_finished_spans()
    index = _by_id(finished)
    [sent] = [s for s in finished if s.kind is SpanKind.PRODUCER]
    assert sent.name.startswith("expirations")
    [received] = [s for s in finished if s.kind is SpanKind.CONSUMER]
    assert sent.context is not None
    assert received.context is not None
    assert received.context.trace_id == sent.context.trace_id
    assert received.parent is not None
    assert received.parent.span_id == sent.context.span_id
    attributes = dict(received.attributes or {})
    assert attributes["messaging.system"] == "rabbitmq"
    assert attributes["messaging.destination.name"] == "expirations"
    assert str(attributes["messaging.message.id"]).startswith(f"expire:{rid}:")
    assert attributes["messaging.rabbitmq.destination.routing_key"] == "expire"
    assert attributes["expiry.redelivered"] is False
    assert not [name for name in attributes if name.startswith("messaging.rabbitmq.message.re")]
    assert isinstance(attributes["messaging.rabbitmq.message.delivery_tag"], int)
    assert (attributes["expiry.attempt"], attributes["expiry.outcome"]) == (1, "expired")
    database = [
        s for s in finished if s.kind is SpanKind.CLIENT and received in _ancestors(s, index)
    ]
    [update] = database  # the guarded update, one database span under the consumer span
    assert update.name == "expire reservations"
    assert {k: v for k, v in (update.attributes or {}).items() if k.startswith("db.")} == {
        "db.system": "postgresql",
        "db.operation": "UPDATE",
        "db.sql.table": "reservations",
    }


async def test_the_head_decides_for_the_consumer_and_the_database(
    stack: Stack, spans: InMemorySpanExporter
) -> None:
    """Two commands whose traceparent says sampled and not sampled, batched together: the
    sampled job has its consumer span and its database spans in its trace; the unsampled
    one leaves no span anywhere."""
    spans.clear()
    sampled, unsampled = f"{secrets.randbits(128):032x}", f"{secrets.randbits(128):032x}"
    ids = await insert_holds(stack.database_url, 2)
    now = datetime.now(UTC)
    for rid, (trace_id, flags) in zip(ids, [(unsampled, "00"), (sampled, "01")], strict=True):
        parent = f"00-{trace_id}-{secrets.randbits(64) | 1:016x}-{flags}"
        with suppress_instrumentation():  # the header as written, not the publisher's span
            await publish_raw(
                stack.amqp_url, [command_body(rid, now)], headers={"traceparent": parent}
            )
    async with running_consumer(stack.settings):  # both queued: one batch
        await eventually(lambda: _expired(stack, 2))
    finished = spans.get_finished_spans()
    traces = {f"{s.context.trace_id:032x}" for s in finished if s.context is not None}
    assert unsampled not in traces
    in_sampled = [s for s in finished if s.context and f"{s.context.trace_id:032x}" == sampled]
    [received] = [s for s in in_sampled if s.kind is SpanKind.CONSUMER]
    assert (received.attributes or {})["messaging.operation.type"] == "process"
    assert (received.attributes or {})["expiry.outcome"] == "expired"
    index = _by_id(finished)
    database = [s for s in in_sampled if received in _ancestors(s, index)]
    assert [(s.name, s.kind) for s in database] == [("expire reservations", SpanKind.CLIENT)]


async def test_each_expiry_records_the_trace_its_event_continues(
    stack: Stack, spans: InMemorySpanExporter
) -> None:
    """Batched together, a sampled job and an unsampled one: the sampled one's event
    carries its consumer span's traceparent (the relay's publish continues that span),
    the unsampled one's the command's own traceparent, as it came."""
    spans.clear()
    ids = await insert_holds(stack.database_url, 2)
    now = datetime.now(UTC)
    parents = {}
    for rid, flags in zip(ids, ["01", "00"], strict=True):
        parents[rid] = f"00-{secrets.randbits(128):032x}-{secrets.randbits(64) | 1:016x}-{flags}"
        with suppress_instrumentation():  # the header as written, not the publisher's span
            await publish_raw(
                stack.amqp_url, [command_body(rid, now)], headers={"traceparent": parents[rid]}
            )
    async with running_consumer(stack.settings):  # both queued: one batch
        await eventually(lambda: _expired(stack, 2))
    [received] = [s for s in spans.get_finished_spans() if s.kind is SpanKind.CONSUMER]
    assert received.context is not None
    async with pg_connection(stack.database_url) as conn:
        rows = await conn.fetch("SELECT reservation_id, traceparent FROM expiry_events")
    recorded = {row["reservation_id"]: row["traceparent"] for row in rows}
    assert recorded == {
        ids[0]: telemetry.propagation.traceparent_from(received.context),
        ids[1]: parents[ids[1]],
    }
    assert recorded[ids[0]].split("-")[1] == parents[ids[0]].split("-")[1]


async def test_a_replay_is_a_trace_of_its_own_linked_to_the_job_it_replays(
    stack: Stack, spans: InMemorySpanExporter
) -> None:
    """A dead-lettered job replayed: the replayed job's consumer span is in a new trace,
    with a link to the trace of the job it replays."""
    spans.clear()
    job = f"{secrets.randbits(128):032x}"
    parent = f"00-{job}-{secrets.randbits(64) | 1:016x}-01"
    async with running_consumer(stack.settings) as task:
        await wait_for_consumers(stack.amqp_url, 1, task)
        with suppress_instrumentation():
            await publish_raw(
                stack.amqp_url,
                [b"not json"],
                message_ids=["m-replayed"],
                headers={"traceparent": parent},
            )
        await eventually(lambda: _recorded(stack, "m-replayed"))
        replay = run_module(
            "service.deadletters",
            *("replay", "--all", "--yes", "--operator", "alice"),
            env=stack.env(EXPIRY_REPLAY_OPERATORS="alice"),
        )
        assert replay.returncode == 0, replay.stdout + replay.stderr
        await eventually(lambda: _consumer_spans_are(spans, 2))
    first, again = sorted(
        (s for s in spans.get_finished_spans() if s.kind is SpanKind.CONSUMER),
        key=lambda s: s.start_time or 0,
    )
    assert first.context is not None
    assert again.context is not None
    assert f"{first.context.trace_id:032x}" == job
    assert again.context.trace_id != first.context.trace_id
    assert [f"{link.context.trace_id:032x}" for link in again.links] == [job]


async def _recorded(stack: Stack, message_id: str) -> bool:
    async with pg_connection(stack.database_url) as conn:
        return bool(
            await conn.fetchval(
                "SELECT count(*) FROM dead_letters WHERE message_id = $1", message_id
            )
        )


async def _consumer_spans_are(spans: InMemorySpanExporter, count: int) -> bool:
    return len([s for s in spans.get_finished_spans() if s.kind is SpanKind.CONSUMER]) == count


async def test_a_retry_stays_in_the_same_trace(stack: Stack, spans: InMemorySpanExporter) -> None:
    """Database away for the first attempt: the retry hop and attempt 2 are in the job's trace."""
    spans.clear()
    await insert_holds(stack.database_url, 1)
    async with database_behind_proxy(stack) as database, consumer_cut_off(stack, database):
        await eventually(lambda: _has_span(spans, "expirations.retry"))
        database.proxy.restore()
        await eventually(lambda: _expired(stack, 1), timeout=30)
    finished = spans.get_finished_spans()
    consumed = sorted(
        (s for s in finished if s.kind is SpanKind.CONSUMER), key=lambda s: s.start_time or 0
    )
    assert [(s.attributes or {}).get("expiry.outcome") for s in consumed] == ["retry", "expired"]
    assert [(s.attributes or {}).get("expiry.attempt") for s in consumed] == [1, 2]
    assert (consumed[0].attributes or {}).get("expiry.error_class") == "db.unavailable"
    assert consumed[0].status.status_code is StatusCode.ERROR
    assert "error.type" in (consumed[0].attributes or {})
    assert [e.name for e in consumed[0].events] == ["exception"]
    assert consumed[1].status.status_code is not StatusCode.ERROR
    traces = {s.context.trace_id for s in consumed if s.context is not None}
    [hop] = [s for s in finished if s.name.startswith("expirations.retry")]
    assert hop.context is not None
    assert traces == {hop.context.trace_id}


async def _has_span(spans: InMemorySpanExporter, name: str) -> bool:
    return any(s.name.startswith(name) for s in spans.get_finished_spans())


def _points(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, object], object]]]:
    data = reader.get_metrics_data()
    found: dict[str, list[tuple[dict[str, object], object]]] = {}
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "value", None)
                    if value is None:
                        value = getattr(point, "count", None)
                    found.setdefault(metric.name, []).append((dict(point.attributes or {}), value))
    return found


def _value(
    points: dict[str, list[tuple[dict[str, object], object]]], name: str, **labels: object
) -> object:
    for attributes, value in points.get(name, []):
        if all(attributes.get(k) == v for k, v in labels.items()):
            return value
    return None


FORGED_TRACE_HEADERS: list[dict[str, Any]] = [
    {"traceparent": 5},
    {"traceparent": b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
    {"traceparent": {"nested": 1}, "tracestate": 7},
    {"traceparent": ["00-x"], "baggage": 5},
    {"baggage": [1, 2], "tracestate": None},
    {"traceparent": "x" * 50000},
]


async def test_forged_trace_headers_cost_nothing_but_the_parent(
    stack: Stack, spans: InMemorySpanExporter
) -> None:
    """Trace headers of any type, on commands and on poison, are read as no context: every
    delivery is still handled and settled, each with its consumer span."""
    spans.clear()
    ids = await insert_holds(stack.database_url, len(FORGED_TRACE_HEADERS))
    now = datetime.now(UTC)
    async with running_consumer(stack.settings) as task:
        await wait_for_consumers(stack.amqp_url, 1, task)
        for rid, headers in zip(ids, FORGED_TRACE_HEADERS, strict=True):
            await publish_raw(stack.amqp_url, [command_body(rid, now)], headers=headers)
            await publish_raw(stack.amqp_url, [b"\x00poison"], headers=headers)
        await eventually(lambda: _expired(stack, len(ids)))
        await eventually(lambda: _depth_is(stack, "expirations.dead", len(ids)))
        assert not task.done()
    assert await queue_depth(stack.amqp_url, "expirations") == 0
    received = [s for s in spans.get_finished_spans() if s.kind is SpanKind.CONSUMER]
    assert len([s for s in received if s.name.startswith("expirations ")]) >= 2 * len(ids)


async def _depth_is(stack: Stack, queue: str, depth: int) -> bool:
    return await queue_depth(stack.amqp_url, queue) == depth


async def test_metrics_follow_a_small_run(stack: Stack) -> None:
    """Outcomes, duplicates, dead letters, lag and the backlog gauges move as expected."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    metrics = Metrics(provider.get_meter("test"))
    await insert_holds(stack.database_url, 5, due_in=-30)
    async with running_consumer(stack.settings, metrics=metrics, backlog_every=0.2) as task:
        await wait_for_consumers(stack.amqp_url, 1, task)
        await eventually(lambda: _true(metrics.gauges.backlog.total == 5))
        assert metrics.gauges.backlog.oldest_due_age_seconds >= 30
        before = _points(reader)
        assert _value(before, "expiry.oldest_due_age") is not None
        assert _value(before, "expiry.backlog", age="10s_1m") == 5
        await scan.scan_once(stack.settings)
        await scan.scan_once(stack.settings.model_copy(update={"lease_seconds": 1}))
        await eventually(lambda: _expired(stack, 5))
        await publish_raw(stack.amqp_url, [b"not json"], message_ids=["poison-m"])
        await eventually(lambda: _true(_value(_points(reader), "expiry.dead_letters") == 1))
        await eventually(lambda: _true(metrics.gauges.backlog.total == 0))
    after = _points(reader)
    provider.shutdown()
    assert _value(after, "expiry.commands", outcome="expired") == 5
    assert (
        _value(after, "expiry.dead_letters", error_class="poison.not-json", give_up="permanent")
        == 1
    )
    assert _value(after, "expiry.lag") == 5  # a histogram: its count
    assert _value(after, "expiry.backlog", age="10s_1m") == 0


async def _true(value: bool) -> bool:
    return value


async def test_health_endpoint_reports_liveness_readiness_and_metrics(stack: Stack) -> None:
    """Ready only with a channel and a database; live regardless; metrics in Prometheus text."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader

    port = free_port()
    provider = MeterProvider(metric_readers=[PrometheusMetricReader()])
    metrics = Metrics(provider.get_meter("test"))
    async with database_behind_proxy(stack, http_port=port) as database:
        proxy = database.proxy
        async with (
            running_consumer(database.settings, metrics=metrics, backlog_every=1.0) as task,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client,
        ):
            await wait_for_consumers(stack.amqp_url, 1, task)
            assert (await client.get("/healthz")).status_code == 200
            ready = await client.get("/readyz")
            assert ready.status_code == 200, ready.text
            assert ready.json() == {
                "ready": True,
                "consuming": True,
                "channel": True,
                "database": True,
            }
            assert "expiry_oldest_due_age" in (await client.get("/metrics")).text
            proxy.cut()
            unready = await client.get("/readyz")
            assert unready.status_code == 503
            assert unready.json()["database"] is False
            assert (await client.get("/healthz")).status_code == 200
            proxy.restore()
            await until_ready(client)  # once its pool has a connection again, however long
            assert (await client.get("/readyz")).status_code == 200
    provider.shutdown()


async def test_the_trace_of_an_expiry_continues_into_its_events_publish(
    stack: Stack, spans: InMemorySpanExporter
) -> None:
    """An event stored with its expiry's traceparent is published in a producer span that
    is its child, with the messaging attributes, and carries the publish's context in its
    headers; an event of no trace gets no span and no header."""
    from tests.events_support import bind_reader_queue, collect_events, insert_events, running_relay

    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    stored = f"00-{trace_id}-{parent_id}-01"
    queue = await bind_reader_queue(stack.amqp_url)
    [traced] = await insert_events(stack, 1, traceparent=stored)
    [untraced] = await insert_events(stack, 1)
    spans.clear()
    async with running_relay(stack.with_settings(relay_poll_seconds=0.2).settings):
        received = {e.message_id: e for e in await collect_events(stack.amqp_url, queue, 2)}
    publishes = [s for s in spans.get_finished_spans() if s.name == "expiry.events publish"]
    [span] = publishes
    assert span.kind is SpanKind.PRODUCER
    assert span.context is not None
    assert span.parent is not None
    assert (format(span.context.trace_id, "032x"), format(span.parent.span_id, "016x")) == (
        trace_id,
        parent_id,
    )
    assert span.attributes is not None
    assert span.attributes["messaging.message.id"] == traced
    assert span.attributes["messaging.destination.name"] == "expiry.events"
    assert span.attributes["messaging.rabbitmq.destination.routing_key"] == "reservation.expired"
    header = str(received[traced].headers["traceparent"])
    assert header.split("-")[1:3] == [trace_id, format(span.context.span_id, "016x")]
    assert "traceparent" not in received[untraced].headers


async def test_a_webhook_attempt_is_a_child_span_of_its_expiry_and_carries_its_context(
    stack: Stack, spans: InMemorySpanExporter
) -> None:
    """A delivery of a traced expiry is POSTed in a client span that is its child (failed
    attempts too: one span each, with the status and the error class), and the request
    carries the span's traceparent; an unsampled expiry's request carries its own
    traceparent on and records nothing; an untraced one, none."""
    from tests.events_support import insert_events
    from tests.webhook_support import Reply, delivering, receiving, register, running_deliverer

    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    sampled, unsampled = f"00-{trace_id}-{parent_id}-01", f"00-{trace_id}-{parent_id}-00"
    async with receiving([Reply(503), Reply(200)]) as receiver:
        stack = delivering(stack, receiver.endpoint(), webhook_concurrency=1)
        await register(stack)
        [traced] = await insert_events(stack, 1, traceparent=sampled)
        spans.clear()
        async with running_deliverer(stack):

            async def traced_delivered() -> bool:
                return receiver.ids().count(traced) == 2

            await eventually(traced_delivered)
            [quiet] = await insert_events(stack, 1, traceparent=unsampled)
            [plain] = await insert_events(stack, 1)

            async def all_arrived() -> bool:
                return {quiet, plain} <= set(receiver.ids())

            await eventually(all_arrived)
    attempts = [s for s in spans.get_finished_spans() if s.name == "POST orders"]
    assert [s.attributes and s.attributes["http.response.status_code"] for s in attempts] == [
        503,
        200,
    ]
    for span in attempts:
        assert span.kind is SpanKind.CLIENT
        assert span.context is not None
        assert span.parent is not None
        assert span.attributes
        assert format(span.context.trace_id, "032x") == trace_id
        assert format(span.parent.span_id, "016x") == parent_id
        assert span.attributes["webhook.id"] == traced
    failed, delivered = attempts
    assert failed.attributes is not None
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes["error.type"] == "webhook.unavailable"
    assert delivered.status.status_code is not StatusCode.ERROR
    by_id = {r.headers["webhook-id"]: r.headers for r in receiver.received}
    sent = [
        r.headers["traceparent"] for r in receiver.received if r.headers["webhook-id"] == traced
    ]
    assert [h.split("-")[2] for h in sent] == [
        format(span.context.span_id, "016x") for span in attempts if span.context is not None
    ]
    assert by_id[quiet]["traceparent"] == unsampled
    assert "traceparent" not in by_id[plain]
