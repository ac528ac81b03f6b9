"""One delivery of the work queue, as the consumer handles it: what it says of itself
(read from untrusted headers into bounded values), since when, and how it ends."""

from __future__ import annotations

import contextvars
import enum
import logging
import time
from dataclasses import dataclass
from uuid import UUID

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind

from service.adapters.amqp.consuming import AmqpMessage
from service.adapters.telemetry import ConsumerTracing, propagation
from service.adapters.telemetry.recording import RecordedSpan
from service.core.dead_letter import ATTEMPT_HEADER, FIRST_SEEN_HEADER, REPLAY_OF_HEADER
from service.core.errors import ServiceError
from service.core.inputs import (
    MAX_ATTEMPT,
    bounded_int,
    headers_of,
    message_id_of,
    recent_millis,
)
from service.core.topology import QUEUE

log = logging.getLogger("service.consume")


@dataclass(frozen=True)
class Attempt:
    """What a delivery says about its own history."""

    number: int
    first_seen_ms: int
    message_id: str


def now_ms() -> int:
    """The worker's wall clock in epoch milliseconds (used only for retry budgets)."""
    return time.time_ns() // 1_000_000


def read_attempt(message: AmqpMessage, now_ms: int) -> Attempt:
    """Read the attempt number and first-seen time from our headers (defaults: 1, now),
    and the message id its dead-letter record and crash counter use (one derived from
    the body when the sender set none: the log line and the record name it alike).

    Never raises: the headers are untrusted (``service.core.inputs``); a value out
    of bounds counts as absent.
    """
    headers = headers_of(message.headers)
    first_seen = recent_millis(headers.get(FIRST_SEEN_HEADER), now_ms)
    return Attempt(
        number=bounded_int(headers.get(ATTEMPT_HEADER), 1, MAX_ATTEMPT) or 1,
        first_seen_ms=now_ms if first_seen is None else min(now_ms, first_seen),
        message_id=message_id_of(message.message_id, message.body),
    )


def attempt_of(message: AmqpMessage) -> Attempt:
    """``read_attempt`` now; should it ever fail, a first attempt (the delivery must
    still be handled and settled)."""
    now = now_ms()
    try:
        return read_attempt(message, now)
    except Exception:
        log.exception("expiry.unreadable_headers")
        return Attempt(number=1, first_seen_ms=now, message_id=message_id_of(None, message.body))


def short_reason(exc: BaseException) -> str:
    """A reason safe to log and to store: our own messages, else only the error type."""
    if isinstance(exc, ServiceError):
        return str(exc)[:200]
    sqlstate = getattr(exc, "sqlstate", None)
    return f"{type(exc).__name__} (sqlstate {sqlstate})" if sqlstate else type(exc).__name__


def arrival_attributes(message: AmqpMessage, attempt: Attempt) -> dict[str, str | int | bool]:
    """A consumer span's attributes from the start: the messaging semantic conventions'
    and ours (``expiry.*``)."""
    attributes: dict[str, str | int | bool] = {
        "messaging.system": "rabbitmq",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        # RabbitMQ's destination is the exchange the message was published to.
        "messaging.destination.name": message.exchange or "",
        "messaging.message.id": attempt.message_id,
        "expiry.attempt": attempt.number,
        "expiry.redelivered": bool(message.redelivered),
    }
    if message.routing_key:
        attributes["messaging.rabbitmq.destination.routing_key"] = message.routing_key
    if message.delivery_tag is not None:
        attributes["messaging.rabbitmq.message.delivery_tag"] = message.delivery_tag
    return attributes


class Stage(enum.Enum):
    """Where a delivery's handling is; ``NEXT`` says where each may go."""

    HANDLING = "handling"  # arrived; nothing sent to the broker for it yet
    SETTLING = "settling"  # an ack, nack or reject was sent (or tried): never another
    ACKING = "acking"  # committed, its ack under way: it ends once that is sent
    ENDED = "ended"  # out of the prefetch window's count (settled, or given back at a stop)


NEXT = {
    Stage.HANDLING: {Stage.SETTLING, Stage.ACKING, Stage.ENDED},
    Stage.SETTLING: {Stage.SETTLING, Stage.ENDED},  # a retry's copy, then its own reject
    Stage.ACKING: {Stage.ENDED},
    Stage.ENDED: set(),
}


@dataclass(eq=False)
class Delivery:
    """One delivery being handled.

    ``span`` is its consumer span when it is traced and sampled (a ``RecordedSpan``, else
    the invalid span): started when it arrives, as a child of the trace context its
    headers carry, and ended when its handling ends (acked, or settled otherwise), so
    that it covers the whole job without anything waiting for it; its batch's span is
    its child. A context holding it is made only for a task of its own
    (``task_context``). A delivery whose ``traceparent`` says the head of its trace did
    not sample it (``unsampled``) gets no span, no attributes and no context: no tracing
    work at all, unless it needs a task of its own (rare).
    """

    message: AmqpMessage
    attempt: Attempt
    started: float
    span: trace.Span = trace.INVALID_SPAN
    traced: trace.Span | None = None  # traced: its span as started (sampled or not)
    parent: otel_context.Context | None = None  # traced: the context its headers carry, once read
    context: contextvars.Context | None = None  # what its own task runs in, once made
    unsampled: bool = False  # the head decided: not sampled
    head_traceparent: str | None = None  # unsampled: its traceparent, read at its arrival
    reservation: UUID | None = None  # once its body parsed
    stage: Stage = Stage.HANDLING

    @classmethod
    def of(cls, message: AmqpMessage, tracing: ConsumerTracing | None) -> Delivery:
        """A delivery that has just arrived; its consumer span starts when traced."""
        delivery = cls(message, attempt_of(message), time.monotonic())
        if tracing is None:
            return delivery
        headers = message.headers or {}
        if tracing.follows_head:
            delivery.head_traceparent = propagation.unsampled_traceparent(headers)
            if delivery.head_traceparent is not None:
                delivery.unsampled = True
                return delivery
        try:  # untrusted: see propagation.py
            parent = propagation.remote_parent(headers)  # None: the current context's
        except propagation.OtherPropagators:
            delivery.parent = propagate.extract(headers)
            parent = None
        link = propagation.link_of(headers, REPLAY_OF_HEADER)
        delivery.traced = span = tracing.recorder.start(
            f"{message.exchange or QUEUE} process",
            SpanKind.CONSUMER,
            arrival_attributes(message, delivery.attempt),
            context=delivery.parent,
            parent=parent,
            links=None if link is None else [link],
        )
        if span.is_recording():
            delivery.span = span
        return delivery

    def trace_context(self) -> otel_context.Context | None:
        """The trace context of its handling: its span's (sampled or not, what its own
        task does follows its decision); unsampled at the head, the remote context read
        now (a retry's copy then carries the decision on, and no span under it is
        sampled anew); untraced, None."""
        if self.traced is not None:
            if self.parent is None:  # its baggage, say, for what its task publishes
                self.parent = self._remote_context()
            return trace.set_span_in_context(self.traced, self.parent)
        if self.unsampled:
            return self._remote_context()
        return None

    def _remote_context(self) -> otel_context.Context:
        """The context its headers carry, on an empty one: never the caller's (a batch's,
        say, whose suppression of the libraries' spans its task must not inherit)."""
        return propagate.extract(self.message.headers or {}, context=otel_context.Context())

    def task_context(self) -> contextvars.Context | None:
        """The context a task of its own runs in (``None``: the caller's), made once; the
        hot path never gets here, only a failure, a suspect or poison."""
        if self.context is None:
            found = self.trace_context()
            if found is not None:
                self.context = contextvars.copy_context()
                self.context.run(otel_context.attach, found)
        return self.context

    def traceparent(self) -> str | None:
        """The trace its expiry is recorded with (``reservation_transitions.traceparent``,
        which its event's publish continues): its consumer span's when that is sampled;
        else the command's own ``traceparent`` when it is a well-formed W3C one (for an
        unsampled delivery, the one read at its arrival: nothing more is done for it);
        else None."""
        if isinstance(self.span, RecordedSpan):
            return self.span.traceparent
        if self.head_traceparent is not None:
            return self.head_traceparent
        return propagation.traceparent_of(self.message.headers)

    def name(self, reservation: UUID) -> None:
        """Its body named ``reservation`` (its span says so too, when it has one)."""
        self.reservation = reservation
        if self.span.is_recording():
            self.span.set_attribute("expiry.reservation_id", str(reservation))

    @property
    def reservation_id(self) -> str:
        """The reservation as logged ("-" while unknown)."""
        return "-" if self.reservation is None else str(self.reservation)

    def elapsed(self) -> float:
        """Seconds since it arrived."""
        return time.monotonic() - self.started

    @property
    def settled(self) -> bool:
        """An ack, nack or reject was sent or tried (or it ended): never another."""
        return self.stage is not Stage.HANDLING

    @property
    def ack_under_way(self) -> bool:
        """Committed and its ack under way: the ack's callback ends it."""
        return self.stage is Stage.ACKING

    def settling(self) -> None:
        """An ack, nack or reject is about to be sent."""
        self._move(Stage.SETTLING)

    def acking(self) -> None:
        """Committed: its ack is about to be sent, and ends it once sent."""
        self._move(Stage.ACKING)

    def end(self) -> bool:
        """Mark its handling ended (once): True the first time."""
        if self.stage is Stage.ENDED:
            return False
        self._move(Stage.ENDED)
        if self.span.is_recording():
            self.span.end()
        return True

    def _move(self, to: Stage) -> None:
        if to not in NEXT[self.stage]:
            raise RuntimeError(f"a delivery does not go from {self.stage.name} to {to.name}")
        self.stage = to
