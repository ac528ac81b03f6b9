"""The retry decision: pure, values in, a decision out."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from service.core.errors import Disposition


class GiveUp(StrEnum):
    """Why a command was dead-lettered."""

    PERMANENT = "permanent"
    ATTEMPTS_EXHAUSTED = "attempts-exhausted"
    AGE_EXHAUSTED = "age-exhausted"
    DELIVERY_LIMIT = "delivery-limit"
    # Dead-lettered by the broker for other reasons (x-death): a consumer rejected it
    # (its retry or dead-letter copy was refused, or its handling failed unexpectedly),
    # its per-message TTL ran out, or a length limit pushed it out.
    REJECTED = "rejected"
    EXPIRED = "expired"
    MAX_LENGTH = "max-length"
    BROKER = "broker"
    # The dead letter itself could not be read into a record.
    UNREADABLE = "unreadable"


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff tiers (seconds, one delay queue each) and the two budgets."""

    delays: tuple[int, ...]
    max_attempts: int
    max_age_seconds: int


@dataclass(frozen=True)
class Retry:
    """Send the command to the delay queue of ``delay_seconds``."""

    delay_seconds: int
    next_attempt: int


@dataclass(frozen=True)
class DeadLetter:
    """Send the command to the dead-letter queue."""

    why: GiveUp


def decide(
    policy: RetryPolicy,
    disposition: Disposition,
    *,
    attempt: int,
    age_seconds: float,
) -> Retry | DeadLetter:
    """Decide what follows a failed ``attempt`` (1-based) of a command this old.

    The delay grows with the attempt and stays at the last tier; the command is
    dead-lettered when the error is permanent, when ``max_attempts`` attempts
    have failed, or when waiting once more would take it past ``max_age_seconds``.
    """
    if disposition is Disposition.PERMANENT:
        return DeadLetter(GiveUp.PERMANENT)
    if attempt >= policy.max_attempts:
        return DeadLetter(GiveUp.ATTEMPTS_EXHAUSTED)
    delay = backoff(policy.delays, attempt)
    if age_seconds + delay > policy.max_age_seconds:
        return DeadLetter(GiveUp.AGE_EXHAUSTED)
    return Retry(delay_seconds=delay, next_attempt=attempt + 1)


def backoff(delays: tuple[int, ...], attempt: int) -> int:
    """The delay after failed ``attempt``: the tiers in order, then the last one."""
    return delays[min(max(attempt, 1), len(delays)) - 1]
