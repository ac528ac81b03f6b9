"""Unit tests for the consumer's one delivery path, with in-memory fakes of the store
(the database) and the publisher (the broker's retry and dead-letter exchanges)."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast
from uuid import UUID

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage
from opentelemetry import trace
from opentelemetry.instrumentation.utils import is_instrumentation_enabled
from opentelemetry.sdk import trace as sdk_trace
from opentelemetry.sdk.trace import TracerProvider, sampling
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from service.adapters.telemetry import ConsumerTracing, add_processor, propagation, recorder_of
from service.adapters.telemetry.metrics import Metrics
from service.adapters.telemetry.recording import RecordedSpan
from service.core import retry as retry_module
from service.core.domain import BatchRow, Expiry, Outcome, command_body
from service.core.errors import PublishNotConfirmed, RowLocked
from service.core.retry import REFUSAL_LIMIT
from service.settings import Settings
from service.worker.acks import AckAlone
from service.worker.batcher import Batcher
from service.worker.consumer import Consumer
from service.worker.delivery import Attempt
from service.worker.failpoints import NO_FAILPOINTS
from service.worker.failures import Failures
from service.worker.inflight import InFlight
from service.worker.quarantine import CRASH_LIMIT, Quarantine
from service.worker.reporting import SUMMARY_COUNTS, Reporter


@dataclass
class FakeMessage:
    """A delivery: what the consumer reads, and how it was settled."""

    body: bytes
    message_id: str | None = "m"
    redelivered: bool = False
    headers: dict[str, Any] = field(default_factory=dict)
    routing_key: str = "expire"
    exchange: str = "expirations"
    delivery_tag: int | None = 1
    content_type: str | None = "application/json"
    content_encoding: str | None = None
    correlation_id: str | None = None
    timestamp: datetime | None = None
    type: str | None = None
    app_id: str | None = None
    settled: list[str] = field(default_factory=list)

    async def ack(self) -> None:
        self.settled.append("ack")

    async def reject(self, requeue: bool = False) -> None:
        self.settled.append("requeue" if requeue else "reject")


@dataclass
class FakeStore:
    """Reservations by id: ``held`` and due unless told otherwise."""

    status: dict[UUID, str] = field(default_factory=dict)
    fail_batches: bool = False
    fail_alone: Exception | None = None
    handled: dict[str, int] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    locked: set[UUID] = field(default_factory=set)  # rows another transaction holds
    no_waiting_room: bool = False  # every connection that may wait for a row waits
    traces: dict[UUID, str | None] = field(default_factory=dict)  # recorded with expiries

    async def expire_many(
        self,
        ids: Sequence[UUID],
        message_ids: Sequence[str],
        attempts: Sequence[int],
        traceparents: Sequence[str | None],
    ) -> dict[UUID, BatchRow]:
        self.calls.append(f"batch of {len(ids)}")
        if self.fail_batches:
            raise OSError("connection lost")
        rows = {rid: self._row(rid) for rid in ids}
        self.traces.update((rid, tp) for rid, tp in zip(ids, traceparents, strict=True))
        return rows

    def _row(self, rid: UUID) -> BatchRow:
        if rid in self.locked:  # skipped by the batch: held and due, not won
            return BatchRow(won=False, lag=None, status="held", due=True)
        status = self.status.get(rid)
        won = status == "held"
        if won:
            self.status[rid] = "expired"
        return BatchRow(won=won, lag=0.1 if won else None, status=self.status.get(rid), due=True)

    async def expire_one(
        self,
        reservation_id: UUID,
        attempt: Attempt,
        *,
        busy: bool = False,
        traceparent: str | None = None,
    ) -> Expiry:
        self.calls.append("alone, busy" if busy else "alone")
        if self.fail_alone is not None:
            raise self.fail_alone
        if busy and self.no_waiting_room:
            raise RowLocked
        self.locked.discard(reservation_id)  # it waited until the other committed
        row = self._row(reservation_id)
        self.traces[reservation_id] = traceparent
        if row.won:
            return Expiry(Outcome.EXPIRED, row.lag)
        return Expiry(Outcome.ALREADY_DONE, None)

    async def mark_handling(self, key: str) -> int:
        self.handled[key] = self.handled.get(key, 0) + 1
        return self.handled[key]

    async def clear_handling(self, key: str) -> None:
        self.handled.pop(key, None)


@dataclass
class FakePublisher:
    """Records the copies; refuses them when told to."""

    refuse: bool = False
    retries: list[aio_pika.Message] = field(default_factory=list)
    dead: list[aio_pika.Message] = field(default_factory=list)
    instrumented: list[bool] = field(default_factory=list)  # each retry: libraries' spans on

    async def retry(self, message: aio_pika.Message, delay_ms: int) -> None:
        if self.refuse:
            raise PublishNotConfirmed("refused")
        self.retries.append(message)
        self.instrumented.append(is_instrumentation_enabled())

    async def dead_letter(self, message: aio_pika.Message) -> None:
        if self.refuse:
            raise PublishNotConfirmed("refused")
        self.dead.append(message)


@dataclass
class World:
    """A consumer wired to the fakes."""

    consumer: Consumer
    store: FakeStore
    publisher: FakePublisher
    in_flight: InFlight
    batcher: Batcher
    reporter: Reporter

    async def deliver(self, *messages: FakeMessage) -> None:
        """Hand the messages to the consumer and wait until each is handled."""
        for message in messages:
            await self.consumer.on_message(cast(AbstractIncomingMessage, message))
        async with asyncio.timeout(5):
            await asyncio.sleep(0)
            while len(self.in_flight):
                await asyncio.sleep(0.01)


def new_world(tracing: ConsumerTracing | None = None) -> World:
    """The router with a real batcher, reporter and in-flight count over the fakes."""
    settings = Settings(retry_delays=(1, 5), max_attempts=3)
    store, publisher, in_flight, acks = FakeStore(), FakePublisher(), InFlight(), AckAlone()
    reporter = Reporter(Metrics())
    batcher = Batcher(store, size=10, wait_ms=0, workers=1)
    consumer = Consumer(
        batcher=batcher,
        store=store,
        quarantine=Quarantine(store, NO_FAILPOINTS),
        failures=Failures(settings, publisher, acks, reporter),
        acks=acks,
        reporter=reporter,
        failpoints=NO_FAILPOINTS,
        in_flight=in_flight,
        tracing=tracing,
    )
    return World(consumer, store, publisher, in_flight, batcher, reporter)


@pytest.fixture
async def world() -> AsyncIterator[World]:
    """``new_world``, its batcher closed after the test."""
    made = new_world()
    yield made
    await made.batcher.close()


def command(store: FakeStore, status: str | None = "held", **kwargs: Any) -> FakeMessage:
    """A valid command for a reservation in ``status`` (None: unknown)."""
    rid = uuid.uuid4()
    if status is not None:
        store.status[rid] = status
    return FakeMessage(command_body(rid, datetime.now(UTC)), message_id=f"expire:{rid}", **kwargs)


def outcomes(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [str(getattr(r, "outcome", "")) for r in caplog.records if r.msg == "expiry.outcome"]


async def test_a_due_hold_is_expired_acked_and_reported_once(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """A first delivery of a valid command: one batch, one ack, one outcome line."""
    caplog.set_level(logging.DEBUG)  # the per-delivery expiry.outcome line
    message = command(world.store)
    await world.deliver(message)
    assert world.store.calls == ["batch of 1"]
    assert message.settled == ["ack"]
    assert outcomes(caplog) == ["expired"]


async def test_a_command_twice_in_one_batch_expires_once(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """The second copy is already-done; both are acked; the hold changed once."""
    caplog.set_level(logging.DEBUG)  # the per-delivery expiry.outcome line
    first = command(world.store)
    second = FakeMessage(first.body, message_id=first.message_id)
    consumed = command(world.store, "consumed")
    await world.deliver(first, second, consumed)
    assert [m.settled for m in (first, second, consumed)] == [["ack"]] * 3
    assert sorted(outcomes(caplog)) == ["already-done", "expired", "not-eligible"]


@pytest.mark.parametrize("room", [True, False])
async def test_a_row_the_batch_skipped_waits_alone_only_if_there_is_room(
    world: World, room: bool
) -> None:
    """A row another transaction holds: its neighbours are acked from the batch; it goes
    on alone, waiting for its row where a connection is free to wait, else retried later
    (its place in the prefetch window freed)."""
    locked, free = command(world.store), command(world.store)
    world.store.locked.add(UUID(json.loads(locked.body)["reservation_id"]))
    world.store.no_waiting_room = not room
    await world.deliver(locked, free)
    assert world.store.calls == ["batch of 2", "alone, busy"]
    assert (locked.settled, free.settled) == (["ack"], ["ack"])
    assert len(world.publisher.retries) == (0 if room else 1)


async def test_at_info_each_delivery_is_counted_in_a_summary_not_logged(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """The default level: no line per delivery; one expiry.summary with the counts, then
    none while nothing happens."""
    caplog.set_level(logging.INFO)
    first = command(world.store)
    await world.deliver(first, FakeMessage(first.body, message_id=first.message_id))
    await world.deliver(command(world.store, "consumed"), command(world.store))
    assert outcomes(caplog) == []
    world.reporter.summarize()
    world.reporter.summarize()
    [summary] = [r for r in caplog.records if r.msg == "expiry.summary"]
    counts = {name: getattr(summary, name) for name in SUMMARY_COUNTS}
    assert counts == {
        "expired": 2,
        "already_done": 1,
        "not_eligible": 1,
        "retried": 0,
        "dead_lettered": 0,
    }
    assert (summary.levelno, summary.__dict__["deliveries"]) == (logging.INFO, 4)


@pytest.mark.parametrize(
    ("body", "error_class"),
    [
        (b"\x00 not json", "poison.not-json"),
        (b'{"reservation_id": "x", "hold_until": "2020-01-01T00:00:00+00:00"}', "poison.bad-uuid"),
    ],
)
async def test_poison_is_dead_lettered_then_acked(
    world: World, body: bytes, error_class: str
) -> None:
    """An unusable body goes to the dead letters with why; the store is never asked."""
    message = FakeMessage(body)
    await world.deliver(message)
    [copy] = world.publisher.dead
    assert copy.headers["x-expiry-error-class"] == error_class
    assert copy.headers["x-expiry-give-up"] == "permanent"
    assert message.settled == ["ack"]
    assert world.store.calls == []


async def test_an_unknown_reservation_is_dead_lettered(world: World) -> None:
    """A command for a reservation that does not exist is a permanent failure."""
    message = command(world.store, status=None)
    await world.deliver(message)
    [copy] = world.publisher.dead
    assert copy.headers["x-expiry-error-class"] == "unknown-reservation"
    assert message.settled == ["ack"]


async def test_a_failed_batch_falls_back_and_a_transient_failure_retries(world: World) -> None:
    """The batch fails, the delivery goes alone, fails too: retried with attempt 2."""
    world.store.fail_batches = True
    world.store.fail_alone = OSError("database away")
    message = command(world.store)
    await world.deliver(message)
    assert world.store.calls == ["batch of 1", "alone"]
    [copy] = world.publisher.retries
    assert copy.headers["x-expiry-attempt"] == 2
    assert copy.headers["x-expiry-error-class"] == "db.unavailable"
    assert message.settled == ["ack"]


async def test_a_refused_copy_returns_the_delivery_then_ends_the_loop(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refused copy returns the delivery (reject, requeue); at the limit it is rejected
    for good, so that the broker dead-letters it."""
    monkeypatch.setattr(retry_module, "REQUEUE_PAUSE_SECONDS", 0.0)
    world.publisher.refuse = True
    first = FakeMessage(b"junk")
    last = FakeMessage(b"junk", redelivered=True, headers={"x-delivery-count": REFUSAL_LIMIT - 1})
    await world.deliver(first, last)
    assert first.settled == ["requeue"]
    assert last.settled == ["reject"]


async def test_a_redelivered_command_is_counted_and_handled_alone(world: World) -> None:
    """A suspect is counted, expired alone and its count cleared; past the limit of crashes
    it is dead-lettered instead of being tried again."""
    message = command(world.store, redelivered=True)
    await world.deliver(message)
    assert world.store.calls == ["alone"]
    assert message.settled == ["ack"]
    assert world.store.handled == {}
    killer = command(world.store, redelivered=True)
    world.store.handled[str(killer.message_id)] = CRASH_LIMIT
    await world.deliver(killer)
    [copy] = world.publisher.dead
    assert copy.headers["x-expiry-error-class"] == "consumer-crash"
    assert world.store.calls == ["alone"]  # the killer was never tried again


async def test_a_bug_in_failure_handling_rejects_for_good(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever fails unexpectedly, the delivery is settled: rejected, never left open."""

    async def broken(*_args: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(Failures, "handle", broken)
    message = FakeMessage(b"junk")
    await world.deliver(message)
    assert message.settled == ["reject"]
    assert len(world.in_flight) == 0


async def test_a_delivery_whose_batch_never_ran_is_left_to_redelivery(world: World) -> None:
    """Stopping with a delivery still queued for its batch: neither acked nor rejected."""
    await world.batcher.close()
    message = command(world.store)
    await world.consumer.on_message(cast(AbstractIncomingMessage, message))
    await world.batcher.close()
    assert message.settled == []
    assert len(world.in_flight) == 0


async def test_a_traced_delivery_is_one_span_from_arrival_to_ack(world: World) -> None:
    """With tracing, a delivery still joins its batch and the broker's callback returns at
    once; its consumer span starts then and ends when it is acked, carrying the
    outcome."""
    exporter = InMemorySpanExporter()
    world.consumer.tracing = _traced(exporter)
    message = command(world.store)
    await world.consumer.on_message(cast(AbstractIncomingMessage, message))
    assert (message.settled, exporter.get_finished_spans()) == ([], ())  # not waited for
    await world.deliver()
    assert message.settled == ["ack"]
    assert world.store.calls == ["batch of 1"]
    [batch, span] = exporter.get_finished_spans()  # its batch's ends first
    assert (span.name, span.kind) == ("expirations process", trace.SpanKind.CONSUMER)
    assert batch.parent == span.context
    attributes = dict(span.attributes or {})
    assert attributes["expiry.outcome"] == "expired"
    assert attributes["expiry.attempt"] == 1


def _consumer_spans(exporter: InMemorySpanExporter) -> list[sdk_trace.ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.kind is trace.SpanKind.CONSUMER]


def _traced(
    exporter: InMemorySpanExporter,
    sampler: sampling.Sampler = sampling.DEFAULT_ON,
    *,
    follows_head: bool = True,
) -> ConsumerTracing:
    provider = TracerProvider(sampler=sampler)
    add_processor(provider, SimpleSpanProcessor(exporter))
    return ConsumerTracing(recorder_of(provider, "test"), follows_head=follows_head)


SAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
UNSAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"


@pytest.fixture
def spans_made(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every span object made from now on, recording or not, SDK or API."""
    made: list[object] = []
    for kind in (sdk_trace.Span, trace.NonRecordingSpan, RecordedSpan):
        original = kind.__init__

        def counting(self: object, *args: Any, __original: Any = original, **kwargs: Any) -> None:
            made.append(self)
            __original(self, *args, **kwargs)

        monkeypatch.setattr(kind, "__init__", counting)
    return made


async def test_an_unsampled_head_makes_no_span_anywhere_in_the_consumer(
    world: World, spans_made: list[object]
) -> None:
    """The scan decided not to sample it (its traceparent says so): the consumer makes no
    span object for it, its batch none, and exports nothing; it is handled as any other."""
    exporter = InMemorySpanExporter()
    world.consumer.tracing = _traced(exporter)
    propagation.install()
    message = command(world.store, headers={"traceparent": UNSAMPLED})
    await world.deliver(message)
    assert message.settled == ["ack"]
    assert world.store.calls == ["batch of 1"]
    assert spans_made == []
    assert exporter.get_finished_spans() == ()


async def test_a_sampled_head_is_one_consumer_span_in_its_trace(world: World) -> None:
    """The scan sampled it: the consumer span is the child of the scan's span, in its trace."""
    exporter = InMemorySpanExporter()
    world.consumer.tracing = _traced(exporter)
    propagation.install()
    await world.deliver(command(world.store, headers={"traceparent": SAMPLED}))
    [span] = _consumer_spans(exporter)
    assert span.context is not None
    assert span.parent is not None
    assert f"{span.context.trace_id:032x}" == SAMPLED.split("-")[1]
    assert f"{span.parent.span_id:016x}" == SAMPLED.split("-")[2]


@pytest.mark.parametrize(
    ("sampler", "follows_head", "headers", "spans"),
    [
        (sampling.DEFAULT_ON, True, {}, 1),  # no context: the consumer's sampler says yes
        (sampling.DEFAULT_OFF, True, {}, 0),  # ... or no
        (sampling.ParentBasedTraceIdRatio(0.0), True, {"traceparent": SAMPLED}, 1),
        # a sampler that is not parent-based decides for itself, whatever the head said
        (sampling.ALWAYS_ON, False, {"traceparent": UNSAMPLED}, 1),
        # a traceparent the standard cannot read counts as none
        (sampling.DEFAULT_ON, True, {"traceparent": UNSAMPLED + "-more"}, 1),
        (sampling.DEFAULT_ON, True, {"traceparent": UNSAMPLED.upper()}, 1),
    ],
)
async def test_without_a_head_decision_the_consumer_sampler_decides(
    world: World,
    sampler: sampling.Sampler,
    follows_head: bool,
    headers: dict[str, Any],
    spans: int,
) -> None:
    exporter = InMemorySpanExporter()
    world.consumer.tracing = _traced(exporter, sampler, follows_head=follows_head)
    propagation.install()
    message = command(world.store, headers=headers)
    await world.deliver(message)
    assert message.settled == ["ack"]
    assert len(_consumer_spans(exporter)) == spans


async def test_a_traced_job_carries_the_messaging_conventions_and_no_invented_ones(
    world: World,
) -> None:
    """The consumer span: messaging.* attributes of the semantic conventions only (the
    exchange as destination, the routing key, the delivery tag), ours under expiry.*."""
    exporter = InMemorySpanExporter()
    message = command(world.store, delivery_tag=7)
    world.consumer.tracing = _traced(exporter)
    await world.deliver(message)
    [span] = [s for s in exporter.get_finished_spans() if s.kind is trace.SpanKind.CONSUMER]
    attributes = dict(span.attributes or {})
    assert {k: v for k, v in attributes.items() if k.startswith("messaging.")} == {
        "messaging.system": "rabbitmq",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "expirations",
        "messaging.message.id": message.message_id,
        "messaging.rabbitmq.destination.routing_key": "expire",
        "messaging.rabbitmq.message.delivery_tag": 7,
    }
    assert (attributes["expiry.redelivered"], attributes["expiry.outcome"]) == (False, "expired")
    assert span.status.status_code is not trace.StatusCode.ERROR


@pytest.mark.parametrize(
    ("deliver", "outcome", "error_type"),
    [
        ("transient", "retry", "builtins.OSError"),
        ("poison", "dead-letter", "service.core.errors.PoisonMessage"),
    ],
)
async def test_a_retried_or_dead_lettered_job_ends_its_span_in_error(
    world: World, deliver: str, outcome: str, error_type: str
) -> None:
    """Error status, error.type and the exception event, as the conventions say; the
    event shows our short reason, never the exception's own text (it may quote data)."""
    exporter = InMemorySpanExporter()
    if deliver == "transient":
        world.store.fail_batches = True
        world.store.fail_alone = OSError("password=hunter2 host=db")
        message = command(world.store, headers={"traceparent": SAMPLED})
    else:
        message = FakeMessage(b'{"reservation_id": "customer-name-here"}')
    world.consumer.tracing = _traced(exporter)
    propagation.install()
    await world.deliver(message)
    [span] = [s for s in exporter.get_finished_spans() if s.kind is trace.SpanKind.CONSUMER]
    # its retry copy is published where the libraries' spans are on (not in its batch's
    # suppression of them): the copy's publish span carries the trace on
    assert world.publisher.instrumented == ([True] if deliver == "transient" else [])
    attributes = dict(span.attributes or {})
    assert span.status.status_code is trace.StatusCode.ERROR
    assert (attributes["error.type"], attributes["expiry.outcome"]) == (error_type, outcome)
    [event] = [e for e in span.events if e.name == "exception"]
    shown = " ".join(str(v) for v in (event.attributes or {}).values())
    assert (event.attributes or {})["exception.type"] == error_type
    assert "hunter2" not in shown
    assert "customer-name-here" not in shown
    assert "hunter2" not in str(span.status.description)


# -- the trace each expiry is recorded with (its event's publish continues it) ----------


def _consumer_traceparent(exporter: InMemorySpanExporter) -> str:
    [span] = [s for s in exporter.get_finished_spans() if s.kind is trace.SpanKind.CONSUMER]
    assert span.context is not None
    return propagation.traceparent_from(span.context)


@pytest.mark.parametrize("path", ["batched", "alone", "suspect"])
async def test_a_sampled_delivery_records_its_consumer_span_with_its_expiry(
    world: World, path: str
) -> None:
    """Traced and sampled: the audit row (and so the event) records the consumer span's
    traceparent, whichever way the delivery is expired."""
    exporter = InMemorySpanExporter()
    world.consumer.tracing = _traced(exporter)
    propagation.install()
    world.store.fail_batches = path == "alone"
    message = command(world.store, headers={"traceparent": SAMPLED}, redelivered=path == "suspect")
    await world.deliver(message)
    assert message.settled == ["ack"]
    [recorded] = world.store.traces.values()
    assert recorded == _consumer_traceparent(exporter)
    assert recorded.split("-")[1] == SAMPLED.split("-")[1]  # in the job's trace
    assert recorded.endswith("-01")


@pytest.mark.parametrize(
    ("traced", "headers", "recorded"),
    [
        (True, {"traceparent": UNSAMPLED}, UNSAMPLED),  # unsampled: the header, as read
        (False, {"traceparent": SAMPLED}, SAMPLED),  # no tracing: the command's own
        (False, {"traceparent": f" {UNSAMPLED}\t".encode()}, UNSAMPLED),
        (False, {}, None),
        (False, {"traceparent": 5}, None),  # forged: nothing recorded
        (False, {"traceparent": UNSAMPLED.upper()}, None),
        (False, {"traceparent": UNSAMPLED + "-more"}, None),
        (False, {"traceparent": "00-" + "0" * 32 + "-b7ad6b7169203331-01"}, None),
        (True, {"traceparent": "x" * 5000}, None),
    ],
)
async def test_an_unsampled_or_untraced_delivery_records_its_commands_traceparent(
    world: World, traced: bool, headers: dict[str, Any], recorded: str | None
) -> None:
    """Not sampled, or not traced: the command's own traceparent when it is a well-formed
    W3C one (untrusted: anything else records nothing); no span is made for it."""
    exporter = InMemorySpanExporter()
    if traced:
        world.consumer.tracing = _traced(exporter, sampling.DEFAULT_OFF)
        propagation.install()
    message = command(world.store, headers=headers)
    await world.deliver(message)
    assert message.settled == ["ack"]
    assert list(world.store.traces.values()) == [recorded]
    assert exporter.get_finished_spans() == ()
