"""The deliverer's metrics (``python -m service.deliver``; names in docs/webhooks.md).

Per endpoint (the attribute ``endpoint``, its configured name): deliveries done,
retried and dead (by error class), the latency of each attempt, the waits the shared
rate limit imposed, and whether the endpoint is paused. Units as in ``metrics.py``:
``expiry.webhook.delivered`` is ``expiry_webhook_delivered_total``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from prometheus_client.registry import CollectorRegistry

from service.adapters.postgres.webhook_endpoints import EndpointBacklog
from service.adapters.telemetry import histograms

ATTEMPT_BOUNDARIES = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

HISTOGRAMS: tuple[histograms.Spec, ...] = (
    (
        "expiry.webhook.attempt.duration",
        "s",
        "Time of one HTTP delivery attempt, by endpoint and result",
        ATTEMPT_BOUNDARIES,
    ),
)


# Each endpoint's deliveries, from the database (every deliverer exports the same).
BACKLOG_GAUGES: tuple[tuple[str, str, str, Callable[[EndpointBacklog], float]], ...] = (
    (
        "expiry.webhook.pending",
        "{delivery}",
        "Deliveries not yet made (due, or put off after a failure), by endpoint",
        lambda b: b.pending,
    ),
    (
        "expiry.webhook.oldest_pending_age",
        "s",
        "Since the oldest pending delivery's age budget began: its event's writing, or its "
        "replay (0: none pending)",
        lambda b: b.oldest_age,
    ),
    (
        "expiry.webhook.dead_open",
        "{delivery}",
        "Deliveries dead-lettered and not replayed, by endpoint",
        lambda b: b.dead,
    ),
)


class DeliverMetrics:
    """The deliverer's counters, histogram and gauges."""

    def __init__(
        self, meter: Meter | None = None, *, prometheus: CollectorRegistry | None = None
    ) -> None:
        meter = meter or metrics.get_meter("service")
        self.last_success: float | None = None  # the wall clock's epoch seconds
        # Each endpoint's deliveries as the database last said (read on a timer).
        self.backlogs: list[EndpointBacklog] = []
        self.objective_seconds = 0.0
        self.delivered = meter.create_counter(
            "expiry.webhook.delivered", unit="{delivery}", description="Deliveries answered 2xx"
        )
        self.retried = meter.create_counter(
            "expiry.webhook.retried",
            unit="{delivery}",
            description="Failed attempts put off to a later one, by error class",
        )
        self.dead = meter.create_counter(
            "expiry.webhook.dead",
            unit="{delivery}",
            description="Deliveries dead-lettered, by error class and give-up reason",
        )
        self.lapsed = meter.create_counter(
            "expiry.webhook.leases_lapsed",
            unit="{delivery}",
            description="Attempts whose claim had lapsed when settled (delivered again)",
        )
        self.rate_limited = meter.create_counter(
            "expiry.webhook.rate_limited_waits",
            unit="{wait}",
            description="Times a deliverer waited for the endpoint's shared rate limit",
        )
        self._histograms = histograms.Histograms(meter, HISTOGRAMS, prometheus)
        (self.attempt_duration,) = self._histograms.recorders
        meter.create_observable_gauge(
            "expiry.webhook.paused",
            callbacks=[self._observe_paused],
            unit="1",
            description="1 while the endpoint is paused after failures in a row",
        )
        meter.create_observable_gauge(
            "expiry.webhook.disabled",
            callbacks=[self._observe_disabled],
            unit="1",
            description="1 while the endpoint is disabled (it answered 410 Gone)",
        )
        for name, unit, description, read in BACKLOG_GAUGES:
            meter.create_observable_gauge(
                name, callbacks=[self._observer(read)], unit=unit, description=description
            )
        meter.create_observable_gauge(
            "expiry.webhook.objective",
            callbacks=[self._observe_objective],
            unit="s",
            description="EXPIRY_WEBHOOK_OBJECTIVE_SECONDS: the oldest pending delivery's "
            "age must stay below it",
        )
        meter.create_observable_gauge(
            "expiry.webhook.last_success_timestamp",
            callbacks=[self._observe_last_success],
            unit="s",
            description="When a deliverer last looked for work successfully (Unix time)",
        )

    def close(self) -> None:
        """Take the histograms aggregated here back out of the registry they were shown in."""
        self._histograms.close()

    def attempt(self, endpoint: str, result: str, seconds: float) -> None:
        """One attempt made (``result``: delivered, or its error class)."""
        self.attempt_duration.record(seconds, {"endpoint": endpoint, "result": result})

    def looked(self) -> None:
        """A look for due deliveries succeeded."""
        self.last_success = time.time()

    def _observer(
        self, read: Callable[[EndpointBacklog], float]
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            for backlog in self.backlogs:
                yield Observation(read(backlog), {"endpoint": backlog.endpoint})

        return observe

    def _observe_objective(self, _options: CallbackOptions) -> Iterable[Observation]:
        if self.objective_seconds:
            yield Observation(self.objective_seconds)

    def _observe_paused(self, _options: CallbackOptions) -> Iterable[Observation]:
        for backlog in self.backlogs:  # the database's word, shared by every deliverer
            yield Observation(1 if backlog.paused_for > 0 else 0, {"endpoint": backlog.endpoint})

    def _observe_disabled(self, _options: CallbackOptions) -> Iterable[Observation]:
        for backlog in self.backlogs:
            disabled = backlog.disabled_at is not None
            yield Observation(1 if disabled else 0, {"endpoint": backlog.endpoint})

    def _observe_last_success(self, _options: CallbackOptions) -> Iterable[Observation]:
        if self.last_success is not None:
            yield Observation(self.last_success)
