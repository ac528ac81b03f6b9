"""What the consumer says about each delivery: the log line, the metrics and the span
attributes, each once and only here."""

from __future__ import annotations

import logging
from typing import Any

from service.adapters.metrics import Metrics
from service.adapters.postgres import Expiry
from service.core.domain import Outcome
from service.core.retry import DeadLetter, Retry
from service.core.topology import QUEUE
from service.worker.delivery import Delivery

log = logging.getLogger("service.consume")


class Reporter:
    """Reports deliveries through the log, the metrics and the consumer span."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def arrived(self, delivery: Delivery) -> None:
        """Messaging attributes, and our attempt, on the consumer span (when tracing)."""
        span = delivery.span
        if not span.is_recording():
            return
        message = delivery.message
        span.set_attributes(
            {
                "messaging.system": "rabbitmq",
                "messaging.operation.type": "process",
                "messaging.destination.name": QUEUE,
                "messaging.message.id": delivery.attempt.message_id,
                "messaging.rabbitmq.destination.routing_key": message.routing_key or "",
                "messaging.rabbitmq.message.redelivered": bool(message.redelivered),
                "expiry.attempt": delivery.attempt.number,
            }
        )

    def parsed(self, delivery: Delivery) -> None:
        """Its body named a reservation."""
        if delivery.span.is_recording():
            delivery.span.set_attribute("expiry.reservation_id", delivery.reservation_id)

    def expired(self, delivery: Delivery, expiry: Expiry, *, acked: bool) -> None:
        """A committed guarded update, acked (or not: its channel was gone)."""
        elapsed = delivery.elapsed()
        self.metrics.outcome(expiry.outcome, seconds=elapsed, lag=expiry.lag_seconds)
        _log_outcome(delivery, expiry.outcome, elapsed, acked=acked)
        if delivery.span.is_recording():
            delivery.span.set_attribute("expiry.outcome", expiry.outcome.value)

    def failed(self, delivery: Delivery, error_class: str, decision: Retry | DeadLetter) -> None:
        """A failure, before its copy is published: on the span."""
        if delivery.span.is_recording():
            delivery.span.set_attribute("expiry.error_class", error_class)
            outcome = "retry" if isinstance(decision, Retry) else "dead-letter"
            delivery.span.set_attribute("expiry.outcome", outcome)

    def copied(
        self, delivery: Delivery, decision: Retry | DeadLetter, facts: dict[str, Any]
    ) -> None:
        """Its retry or dead-letter copy was confirmed and the original acked."""
        elapsed = delivery.elapsed()
        error_class = str(facts["error_class"])
        if isinstance(decision, Retry):
            self.metrics.retried(error_class, seconds=elapsed)
            log.info("expiry.retry", extra={**facts, "delay_s": decision.delay_seconds})
        else:
            self.metrics.dead_lettered(error_class, decision.why.value, seconds=elapsed)
            log.warning("expiry.dead_letter", extra={**facts, "give_up": decision.why.value})

    def copy_refused(self, facts: dict[str, Any], why: str, *, final: bool) -> None:
        """The broker refused its copy (it goes back to the queue, or is rejected)."""
        extra = {**facts, "copy_error": why, **({"final": True} if final else {})}
        log.warning("expiry.copy_failed", extra=extra)

    def rejected(self, delivery: Delivery, why: str) -> None:
        """Rejected for good: the work queue dead-letters it itself."""
        log.warning(
            "expiry.dead_letter",
            extra={
                "reservation_id": delivery.reservation_id,
                "message_id": delivery.attempt.message_id,
                "attempt": delivery.attempt.number,
                "give_up": "rejected",
                "reason": why,
            },
        )

    def unhandled(self, delivery: Delivery, exc: BaseException) -> None:
        """A bug in its handling, logged with its traceback."""
        log.error(
            "expiry.unhandled",
            extra={
                "reservation_id": delivery.reservation_id,
                "message_id": delivery.attempt.message_id,
                "settled": delivery.settling,
            },
            exc_info=exc,
        )


def _log_outcome(delivery: Delivery, outcome: Outcome, elapsed: float, *, acked: bool) -> None:
    if not log.isEnabledFor(logging.INFO):  # its facts cost more than the check
        return
    log.info(
        "expiry.outcome",
        extra={
            "reservation_id": delivery.reservation_id,
            "message_id": delivery.attempt.message_id,
            "attempt": delivery.attempt.number,
            "outcome": outcome.value,
            "redelivered": bool(delivery.message.redelivered),
            "acked": acked,
            "elapsed_ms": round(elapsed * 1000, 1),
        },
    )
