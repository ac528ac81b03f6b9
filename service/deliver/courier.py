"""One endpoint's deliveries in one deliverer: claim as many due deliveries as the
endpoint's shared rate limit allows (one statement), POST each (at most ``concurrency``
at once), and settle each by its answer (``bookkeeping.py``; the 2xx in batches,
``receipts.py``, a request's place free as soon as it is answered). Each endpoint has a
courier of its own, so a paused or slow endpoint holds up no other.

On SIGTERM a courier claims nothing more and settles the attempts in flight (each ends
within its endpoint's timeout), then returns.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from uuid import UUID, uuid4

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from service.adapters import postgres
from service.adapters.http.webhook_sender import Sender
from service.adapters.postgres import deliveries as rows
from service.adapters.postgres import webhook_endpoints as endpoints
from service.adapters.telemetry.deliver_metrics import DeliverMetrics
from service.adapters.telemetry.propagation import carrier_for, parent_of, unsampled
from service.adapters.telemetry.recording import Recorder
from service.core.events import event_body
from service.core.webhook_policy import Verdict
from service.deliver.bookkeeping import Bookkeeper
from service.deliver.receipts import AGAIN
from service.settings import Endpoint, Settings

log = logging.getLogger("service.deliver")

# A retired endpoint (--retire) is looked at again this seldom, in case it is registered
# again; a deliverer started with it registers it at its start.
RETIRED_LOOK_SECONDS = 60.0
# A disabled endpoint (it answered 410 Gone) is looked at again this often, to resume
# soon after python -m service.deliver --enable.
DISABLED_LOOK_SECONDS = 5.0


def burst_of(endpoint: Endpoint) -> float:
    """The shared bucket's size: a tenth of a second's requests (at least one), so that
    the rate holds over any second, not only on average."""
    return max(1.0, endpoint.rate_per_second / 10)


@dataclass(eq=False)
class Courier:
    """Delivers to one endpoint until told to stop."""

    settings: Settings
    endpoint: Endpoint
    pool: postgres.Pool
    sender: Sender
    metrics: DeliverMetrics
    token: UUID = field(default_factory=uuid4)  # this deliverer's claims
    rng: Callable[[], float] = random.random
    recorder: Recorder | None = None  # a span per attempt of a traced expiry (None: none)
    follows_head: bool = True  # an unsampled expiry's attempts get no span (tracing.py)
    in_flight: set[asyncio.Task[None]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.books = Bookkeeper(
            self.settings, self.endpoint.name, self.pool, self.metrics, self.token, self.rng
        )

    @property
    def name(self) -> str:
        """The endpoint's name."""
        return self.endpoint.name

    async def run(self, stop: asyncio.Event) -> None:
        """Claim and deliver until ``stop``; then settle what is in flight."""
        limit = self.settings.webhook_concurrency
        while not stop.is_set():
            free = limit - len(self.in_flight)
            if free <= 0:
                await asyncio.wait(self.in_flight, return_when=asyncio.FIRST_COMPLETED)
                continue
            try:
                batch, wait, probe = await self._claim(free)
            except Exception as exc:  # the database, mostly: the courier looks again
                log.warning(
                    "webhook.look_failed",
                    extra={"endpoint": self.name, "error_class": type(exc).__name__},
                )
                batch, wait, probe = [], self.settings.webhook_poll_seconds, False
            for delivery in batch:
                task = asyncio.create_task(self._deliver(delivery, probe=probe))
                self.in_flight.add(task)
                task.add_done_callback(self.in_flight.discard)
            if wait > 0:
                await _sleep(stop, wait)
        if self.in_flight:
            await asyncio.wait(self.in_flight)
        await self.books.receipts.written()

    async def _claim(self, free: int) -> tuple[list[rows.Delivery], float, bool]:
        """Up to ``free`` due deliveries the rate limit allows now, how long to wait before
        looking again, and whether the one claimed is the probe that ends a pause."""
        endpoint, settings = self.endpoint, self.settings
        async with self.pool.acquire() as conn:
            claim = await rows.claim(
                conn,
                self.name,
                free,
                rate=endpoint.rate_per_second,
                burst=burst_of(endpoint),
                probe_seconds=settings.webhook_lease_seconds,
                lease_seconds=settings.webhook_lease_seconds,
                token=self.token,
            )
        tokens, batch = claim.tokens, claim.deliveries
        if not tokens.registered:
            log.warning("webhook.retired", extra={"endpoint": self.name})
            return [], RETIRED_LOOK_SECONDS, False
        self.metrics.looked()  # the look succeeded, whatever it allows
        if tokens.granted == 0:
            return [], self._wait(tokens), False
        if tokens.probe:
            log.info("webhook.probe", extra={"endpoint": self.name})
        return batch, 0.0 if batch else settings.webhook_poll_seconds, tokens.probe

    def _wait(self, tokens: endpoints.Tokens) -> float:
        """How long to wait when the endpoint allows nothing now."""
        if tokens.disabled:
            return DISABLED_LOOK_SECONDS
        if tokens.wait > 0:  # held or paused: looked at again within a poll
            return min(tokens.wait, self.settings.webhook_poll_seconds)
        self.metrics.rate_limited.add(1, {"endpoint": self.name})
        return max(0.001, (1 - tokens.have) / self.endpoint.rate_per_second)

    async def _deliver(self, delivery: rows.Delivery, *, probe: bool) -> None:
        body = event_body(delivery.reservation_id, delivery.hold_until, delivery.expired_at)
        span = self._attempt_span(delivery)
        carried = _carried(span, delivery.traceparent)
        started = time.monotonic()
        answer = await self.sender.post(delivery.message_id, body, datetime.now(UTC), carried)
        seconds = time.monotonic() - started
        self.metrics.attempt(self.name, answer.error_class or "delivered", seconds)
        if span is not None:
            _ended(span, answer.status, answer.error_class, answer.reason)
        if answer.verdict is Verdict.DELIVERED:  # recorded with the others answered meanwhile
            self.books.delivered(delivery, answer, seconds=seconds, probe=probe)
            return
        try:
            settled = await self.books.settle(delivery, answer, seconds=seconds, probe=probe)
        except Exception as exc:  # the lease lapses: delivered again by the next claim
            settled = False
            log.warning(
                "webhook.settle_failed",
                extra={
                    "endpoint": self.name,
                    "message_id": delivery.message_id,
                    "error_class": type(exc).__name__,
                    "then": AGAIN,
                },
            )
        if not settled:
            self.metrics.lapsed.add(1, {"endpoint": self.name})

    def _attempt_span(self, delivery: rows.Delivery) -> trace.Span | None:
        """The attempt's client span, a child of the span its expiry ran in (none when that
        was not traced or not sampled, or this process traces nothing)."""
        if self.recorder is None:
            return None
        if self.follows_head and unsampled({"traceparent": delivery.traceparent}):
            return None  # the flag alone is read: its traceparent goes on as it is
        parent = parent_of(delivery.traceparent)
        if parent is None:
            return None
        return self.recorder.start(
            f"POST {self.name}",
            SpanKind.CLIENT,
            {
                "http.request.method": "POST",
                "webhook.endpoint": self.name,
                "webhook.id": delivery.message_id,
                "webhook.attempt": delivery.attempts + 1,
            },
            parent=parent,
        )


def _carried(span: trace.Span | None, traceparent: str | None) -> dict[str, str]:
    """The trace headers the request carries: the attempt span's context, or with no span
    the expiry's own ``traceparent`` (the receiver joins its trace either way)."""
    if span is not None:
        return {key: str(value) for key, value in carrier_for(span).items()}
    if traceparent is None or parent_of(traceparent) is None:
        return {}
    return {"traceparent": traceparent}


def _ended(span: trace.Span, status: int | None, error_class: str | None, reason: str) -> None:
    """The attempt's span ended with its answer: the status, and an error's class."""
    if status is not None:
        span.set_attribute("http.response.status_code", status)
    if error_class is not None:
        span.set_attribute("error.type", error_class)
        span.set_status(Status(StatusCode.ERROR, reason))
    span.end()


async def _sleep(stop: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds``, or less when ``stop`` is set meanwhile."""
    try:
        async with asyncio.timeout(seconds):
            await stop.wait()
    except TimeoutError:
        pass
