"""Unit tests for service.core.retry: backoff tiers and the two budgets."""

from __future__ import annotations

import pytest

from service.core.errors import Disposition
from service.core.retry import DeadLetter, GiveUp, Retry, RetryPolicy, backoff, decide

POLICY = RetryPolicy(delays=(1, 5, 30), max_attempts=5, max_age_seconds=100)


@pytest.mark.parametrize(("attempt", "delay"), [(1, 1), (2, 5), (3, 30), (4, 30), (50, 30)])
def test_backoff_climbs_the_tiers_then_stays_on_the_last(attempt: int, delay: int) -> None:
    """Attempt n waits the n-th tier, and the last tier after that."""
    assert backoff(POLICY.delays, attempt) == delay


@pytest.mark.parametrize(
    ("disposition", "attempt", "age", "expected"),
    [
        (Disposition.TRANSIENT, 1, 0.0, Retry(delay_seconds=1, next_attempt=2)),
        (Disposition.TRANSIENT, 2, 10.0, Retry(delay_seconds=5, next_attempt=3)),
        (Disposition.TRANSIENT, 4, 60.0, Retry(delay_seconds=30, next_attempt=5)),
        (Disposition.TRANSIENT, 5, 0.0, DeadLetter(GiveUp.ATTEMPTS_EXHAUSTED)),
        (Disposition.TRANSIENT, 3, 71.0, DeadLetter(GiveUp.AGE_EXHAUSTED)),
        (Disposition.TRANSIENT, 3, 70.0, Retry(delay_seconds=30, next_attempt=4)),
        (Disposition.PERMANENT, 1, 0.0, DeadLetter(GiveUp.PERMANENT)),
    ],
)
def test_decide(
    disposition: Disposition, attempt: int, age: float, expected: Retry | DeadLetter
) -> None:
    """Permanent errors and spent budgets dead-letter; the rest wait a tier."""
    assert decide(POLICY, disposition, attempt=attempt, age_seconds=age) == expected


def test_decide_never_loops_forever() -> None:
    """Following the decisions from attempt 1 always ends in a dead letter."""
    attempt, age = 1, 0.0
    for _ in range(100):
        decision = decide(POLICY, Disposition.TRANSIENT, attempt=attempt, age_seconds=age)
        if isinstance(decision, DeadLetter):
            break
        age += decision.delay_seconds
        attempt = decision.next_attempt
    else:
        pytest.fail("retries never ended")
    assert attempt <= POLICY.max_attempts
