"""What follows a failure, decided purely: values in, a decision out.

``decide``: a failed attempt is retried through a delay tier or dead-lettered.
``after_refusal``: a delivery whose retry or dead-letter copy the broker refused goes
back to the queue after a pause, or, once it has been returned ``REFUSAL_LIMIT`` times,
is rejected for good (the work queue then dead-letters it itself: the loop ends below
its delivery limit, whatever the broker version counts).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from service.core.errors import Disposition
from service.core.topology import slot_delays_ms


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
    """Backoff tiers (seconds: each the bound of its wait), the two budgets, and the
    jitter: the fraction of each tier's delay over which its ``slots`` delay queues spread
    (0: one queue per tier, the wait is the bound)."""

    delays: tuple[int, ...]
    max_attempts: int
    max_age_seconds: int
    jitter: float = 0.0
    slots: int = 1


@dataclass(frozen=True)
class Retry:
    """Send the command to the delay queue of ``delay_ms``, a slot of the tier whose
    bound is ``bound_seconds``."""

    delay_ms: int
    bound_seconds: int
    next_attempt: int

    @property
    def delay_seconds(self) -> float:
        """The chosen delay in seconds."""
        return self.delay_ms / 1000


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
    draw: float,
) -> Retry | DeadLetter:
    """Decide what follows a failed ``attempt`` (1-based) of a command this old.

    The tier grows with the attempt and stays at the last one; ``draw``, a random
    number in ``[0, 1)`` drawn by the caller, picks one of its slots uniformly. The
    command is dead-lettered when the error is permanent, when ``max_attempts``
    attempts have failed, or when waiting the tier's bound would take it past
    ``max_age_seconds``.
    """
    if not 0.0 <= draw < 1.0:
        raise ValueError(f"draw must be in [0, 1), not {draw!r}")
    if disposition is Disposition.PERMANENT:
        return DeadLetter(GiveUp.PERMANENT)
    if attempt >= policy.max_attempts:
        return DeadLetter(GiveUp.ATTEMPTS_EXHAUSTED)
    bound = backoff(policy.delays, attempt)
    if age_seconds + bound > policy.max_age_seconds:
        return DeadLetter(GiveUp.AGE_EXHAUSTED)
    slots = slot_delays_ms(bound, policy.jitter, policy.slots)
    delay_ms = slots[min(int(draw * len(slots)), len(slots) - 1)]
    return Retry(delay_ms=delay_ms, bound_seconds=bound, next_attempt=attempt + 1)


def backoff(delays: tuple[int, ...], attempt: int) -> int:
    """The delay after failed ``attempt``: the tiers in order, then the last one."""
    return delays[min(max(attempt, 1), len(delays)) - 1]


# A refused copy returns the delivery after 1, 2, 4, 8 s; at the limit it is rejected.
REQUEUE_PAUSE_SECONDS = 1.0
MAX_REQUEUE_PAUSE_SECONDS = 8.0
REFUSAL_LIMIT = 5


@dataclass(frozen=True)
class Requeue:
    """Return the delivery to the work queue (``basic.reject``, requeue) after a pause."""

    pause_seconds: float


@dataclass(frozen=True)
class Reject:
    """Reject the delivery for good: the work queue dead-letters it itself."""

    why: str


def after_refusal(returned: int, why: str) -> Requeue | Reject:
    """What follows a copy the broker refused (``why``), for a delivery the broker says
    was returned ``returned`` times before."""
    if returned + 1 >= REFUSAL_LIMIT:
        return Reject(f"copy refused {returned + 1} times: {why}")
    pause = REQUEUE_PAUSE_SECONDS * 2 ** min(returned, 8)
    return Requeue(min(pause, MAX_REQUEUE_PAUSE_SECONDS))
