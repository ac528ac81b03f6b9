"""What the consumer says about each delivery: the log line, the metrics and the span
attributes, each once and only here (the attributes a delivery arrives with are given to
its span as it starts: ``delivery.arrival_attributes``).

At ``INFO`` the log carries what an operator acts on: every retry, dead letter, refused
copy and bug, each as it happens, and every ``SUMMARY_SECONDS`` one ``expiry.summary``
line with the counts of what the consumer did since the last one. One
``expiry.outcome`` line per handled delivery is ``DEBUG``: at a few thousand expiries
a second it would be a large share of the consumer's time (figures:
docs/benchmark.md#one-outcome-line-per-delivery), and the database's audit trail
(``reservation_transitions``) already records every transition.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections import Counter
from typing import Any

from opentelemetry.trace import Status, StatusCode

from service.adapters.telemetry.metrics import Metrics
from service.core.domain import Expiry, Outcome
from service.core.retry import Reject, Retry
from service.worker.delivery import Delivery
from service.worker.endings import Copied, Ending, Failure, Refused

log = logging.getLogger("service.consume")

SUMMARY_SECONDS = 10.0

# The field of an ``expiry.summary`` line that counts each outcome, and all its counts
# in the order it shows them.
SUMMARY_FIELDS = {outcome: outcome.value.replace("-", "_") for outcome in Outcome}
SUMMARY_COUNTS = (*SUMMARY_FIELDS.values(), "retried", "dead_lettered")


class Reporter:
    """Reports deliveries through the log, the metrics and the consumer span."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.counts: Counter[str] = Counter()
        self.since = time.monotonic()

    def summarize(self) -> None:
        """One ``expiry.summary`` line (``INFO``) with the counts since the last one, if
        anything happened; then start counting again."""
        now = time.monotonic()
        counts, self.counts = self.counts, Counter()
        interval, self.since = now - self.since, now
        if not counts:
            return
        log.info(
            "expiry.summary",
            extra={
                "interval_s": round(interval, 1),
                "deliveries": sum(counts.values()),
                **{name: counts[name] for name in SUMMARY_COUNTS},
            },
        )

    def expired(self, delivery: Delivery, expiry: Expiry, *, acked: bool) -> None:
        """A committed guarded update, acked (or not: its channel was gone)."""
        elapsed = delivery.elapsed()
        self.metrics.outcome(
            expiry.outcome,
            seconds=elapsed,
            lag=expiry.lag_seconds,
            since_published=expiry.since_published_seconds,
        )
        self.counts[SUMMARY_FIELDS[expiry.outcome]] += 1
        _log_outcome(delivery, expiry.outcome, elapsed, acked=acked)
        if delivery.span.is_recording():
            delivery.span.set_attribute("expiry.outcome", expiry.outcome.value)

    def ended(self, delivery: Delivery, ending: Ending, *, sent: bool) -> None:
        """A delivery settled alone (``sent``: the broker was told; if not, its channel was
        gone and the broker redelivers it). A failure's span ends in error, as the
        messaging conventions say (``error.type``, the exception, an error status)."""
        failure = ending.failure
        facts = _facts(delivery, failure)
        if failure is not None:
            outcome = "retry" if isinstance(failure.decision, Retry) else "dead-letter"
            _span_failed(delivery, failure, outcome=outcome)
        if isinstance(ending, Copied):
            if sent:
                self._copied(delivery, ending.failure, facts)
            return
        if isinstance(ending, Refused):
            then = ending.then
            final = isinstance(then, Reject)
            extra = {**facts, "copy_error": ending.refused, **({"final": True} if final else {})}
            log.warning("expiry.copy_failed", extra=extra)
            if isinstance(then, Reject) and sent:
                self._rejected(delivery, then.why)
        elif sent:
            self._rejected(delivery, ending.why)

    def _copied(self, delivery: Delivery, failure: Failure, facts: dict[str, Any]) -> None:
        elapsed = delivery.elapsed()
        decision = failure.decision
        if isinstance(decision, Retry):
            self.counts["retried"] += 1
            self.metrics.retried(failure.error_class, seconds=elapsed)
            delays = {"delay_s": decision.delay_seconds, "bound_s": decision.bound_seconds}
            log.info("expiry.retry", extra={**facts, **delays})
        else:
            self.counts["dead_lettered"] += 1
            self.metrics.dead_lettered(failure.error_class, decision.why.value, seconds=elapsed)
            log.warning("expiry.dead_letter", extra={**facts, "give_up": decision.why.value})

    def _rejected(self, delivery: Delivery, why: str) -> None:
        self.counts["dead_lettered"] += 1
        if delivery.span.is_recording():
            delivery.span.set_attribute("expiry.outcome", "dead-letter")
            delivery.span.set_attribute("error.type", "rejected")
            delivery.span.set_status(Status(StatusCode.ERROR, "rejected for good"))
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
                "settled": delivery.settled,
            },
            exc_info=exc,
        )


def _log_outcome(delivery: Delivery, outcome: Outcome, elapsed: float, *, acked: bool) -> None:
    if not log.isEnabledFor(logging.DEBUG):  # its facts cost more than the check
        return
    log.debug(
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


def _facts(delivery: Delivery, failure: Failure | None) -> dict[str, Any]:
    """What every line about a failed delivery says."""
    facts: dict[str, Any] = {
        "reservation_id": delivery.reservation_id,
        "message_id": delivery.attempt.message_id,
        "attempt": delivery.attempt.number,
    }
    if failure is not None:
        facts["error_class"] = failure.error_class
        facts["reason"] = failure.reason
        facts["elapsed_ms"] = round(delivery.elapsed() * 1000, 1)
    return facts


def _span_failed(delivery: Delivery, failure: Failure, *, outcome: str) -> None:
    """Error status, ``error.type`` and the exception event on the delivery's span.

    The event carries what is safe to show (``short_reason``: our own messages,
    else only the type) and the frames of the traceback, never the exception's
    text, which may quote a value a message carried.
    """
    span = delivery.span
    if not span.is_recording():
        return
    exc = failure.exc
    kind = type(exc)
    error_type = f"{kind.__module__}.{kind.__qualname__}"
    reason = failure.reason
    span.set_attributes(
        {
            "error.type": error_type,
            "expiry.error_class": failure.error_class,
            "expiry.outcome": outcome,
        }
    )
    span.add_event(
        "exception",
        {
            "exception.type": error_type,
            "exception.message": reason,
            "exception.stacktrace": "".join(traceback.format_tb(exc.__traceback__)),
            "exception.escaped": False,
        },
    )
    span.set_status(Status(StatusCode.ERROR, reason))
