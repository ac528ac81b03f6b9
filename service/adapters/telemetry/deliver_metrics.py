"""The deliverer's metrics (``python -m service.deliver``; names in docs/webhooks.md).

Per endpoint (the attribute ``endpoint``, its configured name): deliveries done,
retried and dead (by error class), the latency of each attempt, the waits the shared
rate limit imposed, and whether the endpoint is paused. Units as in ``metrics.py``:
``expiry.webhook.delivered`` is ``expiry_webhook_delivered_total``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from prometheus_client.registry import CollectorRegistry

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


class DeliverMetrics:
    """The deliverer's counters, histogram and gauges."""

    def __init__(
        self, meter: Meter | None = None, *, prometheus: CollectorRegistry | None = None
    ) -> None:
        meter = meter or metrics.get_meter("service")
        self.last_success: float | None = None  # the wall clock's epoch seconds
        self.paused: dict[str, bool] = {}
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

    def _observe_paused(self, _options: CallbackOptions) -> Iterable[Observation]:
        for endpoint, paused in self.paused.items():
            yield Observation(1 if paused else 0, {"endpoint": endpoint})

    def _observe_last_success(self, _options: CallbackOptions) -> Iterable[Observation]:
        if self.last_success is not None:
            yield Observation(self.last_success)
