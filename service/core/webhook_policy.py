"""What one HTTP delivery's answer means, and what comes next: pure, no I/O.

../shared/CONTRACT.md ("Webhooks"), as the Standard Webhooks specification has it: a
2xx is delivered; any other answer (a redirect too: never followed), a timeout, a
connection error or a destination not allowed is a failure, tried again on the
backoff (exponential, with jitter) and never sooner than the ``Retry-After`` it asked
for (up to a cap), which holds back the whole endpoint; 410 Gone disables the
endpoint until an operator enables it. Attempts and age are bounded: past either, a
delivery is a dead letter, and nothing else makes one.

An endpoint that keeps failing (failures in a row) pauses for every deliverer, longer
each time up to a cap; one probe then decides (the shared state is the database's:
``adapters/postgres/webhook_endpoints.py``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

DEAD_LETTER_PREFIX = "webhook:"

# Error classes (the dead letters' and the metrics'): each starts with "webhook.".
REJECTED = "webhook.rejected"  # a 4xx but 408, 410, 425 and 429: the receiver refuses it
REDIRECTED = "webhook.redirected"  # a 3xx: never followed
GONE = "webhook.gone"  # a 410: the endpoint is disabled until enabled again
NOT_ALLOWED = "webhook.not-allowed"  # the destination is not allowed (SSRF guard)
UNAVAILABLE = "webhook.unavailable"  # a 5xx, 408 or 425
RATE_LIMITED = "webhook.rate-limited"  # a 429
TIMED_OUT = "webhook.timed-out"
UNREACHABLE = "webhook.unreachable"  # a connection or TLS error

ATTEMPTS_EXHAUSTED = "attempts-exhausted"
AGE_EXHAUSTED = "age-exhausted"

UNAVAILABLE_STATUSES = frozenset({408, 425})  # a 4xx that says "not now", as a 5xx does
GONE_STATUS = 410


class Verdict(enum.Enum):
    """What an attempt's answer makes of the delivery."""

    DELIVERED = "delivered"
    RETRY = "retry"  # a failure: tried again later (a dead letter once out of budget)
    GONE = "gone"  # 410: the endpoint is disabled; the delivery waits for it


@dataclass(frozen=True)
class Answer:
    """What one attempt came to, with nothing of the response but its status and the
    ``Retry-After`` it asked for (seconds); ``error_class`` is None when delivered."""

    verdict: Verdict
    error_class: str | None
    reason: str  # short, safe: no body, no URL, no secret
    status: int | None = None
    retry_after: float | None = None


def of_status(status: int, retry_after: float | None = None) -> Answer:
    """The answer of an HTTP status (and the ``Retry-After`` it came with, whatever the
    status: a receiver that says when to come back is listened to)."""
    if 200 <= status < 300:
        return Answer(Verdict.DELIVERED, None, f"HTTP {status}", status)
    if status == GONE_STATUS:
        return Answer(Verdict.GONE, GONE, "HTTP 410: the endpoint is gone", status)
    if status == 429:
        error_class, reason = RATE_LIMITED, "HTTP 429"
    elif status >= 500 or status in UNAVAILABLE_STATUSES:
        error_class, reason = UNAVAILABLE, f"HTTP {status}"
    elif 300 <= status < 400:
        error_class, reason = REDIRECTED, f"HTTP {status}: redirects are not followed"
    else:
        error_class, reason = REJECTED, f"HTTP {status}"
    return Answer(Verdict.RETRY, error_class, reason, status, retry_after)


def timed_out(seconds: float) -> Answer:
    """No answer within the endpoint's timeout."""
    return Answer(Verdict.RETRY, TIMED_OUT, f"no answer within {seconds:g} s")


def unreachable(what: str) -> Answer:
    """The connection failed (``what``: the error's type, never its text)."""
    return Answer(Verdict.RETRY, UNREACHABLE, f"connection failed ({what})")


def not_allowed(why: str) -> Answer:
    """The destination is not allowed (no connection was opened): a failure like any
    other, since a name may resolve elsewhere a moment later."""
    return Answer(Verdict.RETRY, NOT_ALLOWED, f"destination not allowed: {why}")


def retry_after_seconds(value: str | None, now: datetime) -> float | None:
    """A ``Retry-After`` header's wait in seconds (delta-seconds or an HTTP date), or
    None when absent or unreadable (then the backoff decides)."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(min(int(text), 10**9))
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


@dataclass(frozen=True)
class RetryPolicy:
    """How long a failed delivery waits before the next attempt, and when it gives up."""

    max_attempts: int
    max_age_seconds: float
    backoff_seconds: float
    backoff_cap_seconds: float
    retry_after_cap_seconds: float

    def delay(self, attempts: int, answer: Answer, rng: Callable[[], float]) -> float:
        """The wait after ``attempts`` failed attempts: exponential backoff with jitter
        (between half the step and the step: failures that came together come back
        spread), and never less than the ``Retry-After`` asked for (up to its cap)."""
        step = min(self.backoff_cap_seconds, self.backoff_seconds * 2.0 ** min(attempts - 1, 60))
        return max(step / 2 + rng() * step / 2, self.hold(answer))

    def hold(self, answer: Answer) -> float:
        """How long the whole endpoint waits after this answer: its ``Retry-After``, up to
        the cap (0: none asked for)."""
        if answer.retry_after is None:
            return 0.0
        return min(answer.retry_after, self.retry_after_cap_seconds)

    def give_up(self, attempts: int, age_seconds: float, delay: float) -> str | None:
        """Why a retryable failure is a dead letter now (None: it is retried): out of
        attempts, or the next attempt would come past the age budget."""
        if attempts >= self.max_attempts:
            return ATTEMPTS_EXHAUSTED
        if age_seconds + delay > self.max_age_seconds:
            return AGE_EXHAUSTED
        return None


def dead_letter_key(endpoint: str, message_id: str) -> str:
    """A delivery's dead letter's key: one per endpoint and event."""
    return f"{DEAD_LETTER_PREFIX}{endpoint}:{message_id}"


def of_dead_letter_key(key: str) -> tuple[str, str] | None:
    """The endpoint and the event's message id of a delivery's dead letter (None: the
    key is a command's)."""
    if not key.startswith(DEAD_LETTER_PREFIX):
        return None
    endpoint, _, message_id = key.removeprefix(DEAD_LETTER_PREFIX).partition(":")
    return (endpoint, message_id) if endpoint and message_id else None
