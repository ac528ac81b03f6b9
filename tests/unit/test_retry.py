"""Unit tests for service.core.retry: backoff tiers, jittered slots and the two budgets."""

from __future__ import annotations

import math

import pytest

from service.core.dead_letter import copy_headers
from service.core.errors import Disposition
from service.core.retry import (
    REFUSAL_LIMIT,
    DeadLetter,
    GiveUp,
    Reject,
    Requeue,
    Retry,
    RetryPolicy,
    after_refusal,
    backoff,
    decide,
)
from service.core.topology import slot_delays_ms

POLICY = RetryPolicy(delays=(1, 5, 30), max_attempts=5, max_age_seconds=100)
JITTERED = RetryPolicy(delays=(1, 5, 30), max_attempts=5, max_age_seconds=100, jitter=0.5, slots=8)
LAST_DRAW = math.nextafter(1.0, 0.0)  # the largest draw below 1


@pytest.mark.parametrize(("attempt", "delay"), [(1, 1), (2, 5), (3, 30), (4, 30), (50, 30)])
def test_backoff_climbs_the_tiers_then_stays_on_the_last(attempt: int, delay: int) -> None:
    """Attempt n waits the n-th tier, and the last tier after that."""
    assert backoff(POLICY.delays, attempt) == delay


@pytest.mark.parametrize(
    ("disposition", "attempt", "age", "expected"),
    [
        (Disposition.TRANSIENT, 1, 0.0, Retry(delay_ms=1000, bound_seconds=1, next_attempt=2)),
        (Disposition.TRANSIENT, 2, 10.0, Retry(delay_ms=5000, bound_seconds=5, next_attempt=3)),
        (Disposition.TRANSIENT, 4, 60.0, Retry(delay_ms=30000, bound_seconds=30, next_attempt=5)),
        (Disposition.TRANSIENT, 5, 0.0, DeadLetter(GiveUp.ATTEMPTS_EXHAUSTED)),
        (Disposition.TRANSIENT, 3, 71.0, DeadLetter(GiveUp.AGE_EXHAUSTED)),
        (Disposition.TRANSIENT, 3, 70.0, Retry(delay_ms=30000, bound_seconds=30, next_attempt=4)),
        (Disposition.PERMANENT, 1, 0.0, DeadLetter(GiveUp.PERMANENT)),
    ],
)
@pytest.mark.parametrize("draw", [0.0, 0.5, LAST_DRAW])
def test_decide_without_jitter_waits_the_tier_whatever_the_draw(
    disposition: Disposition, attempt: int, age: float, expected: Retry | DeadLetter, draw: float
) -> None:
    """Jitter 0 (as before jitter existed): permanent errors and spent budgets dead-letter;
    the rest wait exactly their tier."""
    decision = decide(POLICY, disposition, attempt=attempt, age_seconds=age, draw=draw)
    assert decision == expected


@pytest.mark.parametrize(("attempt", "bound"), [(1, 1), (2, 5), (3, 30), (9, 30)])
def test_the_lowest_draw_takes_the_lowest_slot_and_the_highest_the_bound(
    attempt: int, bound: int
) -> None:
    """Draw 0 picks the window's start, d * (1 - jitter); a draw just below 1 the bound."""
    policy = RetryPolicy(
        delays=(1, 5, 30), max_attempts=10, max_age_seconds=1000, jitter=0.5, slots=8
    )
    low = decide(policy, Disposition.TRANSIENT, attempt=attempt, age_seconds=0.0, draw=0.0)
    high = decide(policy, Disposition.TRANSIENT, attempt=attempt, age_seconds=0.0, draw=LAST_DRAW)
    assert low == Retry(delay_ms=bound * 500, bound_seconds=bound, next_attempt=attempt + 1)
    assert high == Retry(delay_ms=bound * 1000, bound_seconds=bound, next_attempt=attempt + 1)


def test_draws_pick_every_slot_uniformly() -> None:
    """Equal stretches of draws map to the slots one to one, each an eighth of [0, 1)."""
    draws = [(i + 0.5) / 800 for i in range(800)]
    chosen = [
        decide(JITTERED, Disposition.TRANSIENT, attempt=2, age_seconds=0.0, draw=d) for d in draws
    ]
    delays = [c.delay_ms for c in chosen if isinstance(c, Retry)]
    slots = slot_delays_ms(5, 0.5, 8)
    assert {ms: delays.count(ms) for ms in slots} == dict.fromkeys(slots, 100)


@pytest.mark.parametrize("draw", [i / 97 for i in range(97)] + [LAST_DRAW])
@pytest.mark.parametrize("attempt", [1, 2, 3, 4])
def test_a_jittered_retry_never_waits_past_its_bound(draw: float, attempt: int) -> None:
    """Whatever the draw, the delay is one of the tier's slots, within [d(1 - j), d]."""
    decision = decide(JITTERED, Disposition.TRANSIENT, attempt=attempt, age_seconds=0.0, draw=draw)
    assert isinstance(decision, Retry)
    bound = backoff(JITTERED.delays, attempt)
    assert decision.bound_seconds == bound
    assert decision.delay_ms in slot_delays_ms(bound, 0.5, 8)
    assert bound * 500 <= decision.delay_ms <= bound * 1000
    assert decision.delay_seconds == decision.delay_ms / 1000


@pytest.mark.parametrize("draw", [0.0, LAST_DRAW])
def test_the_age_budget_is_judged_on_the_bound_not_the_drawn_delay(draw: float) -> None:
    """A retry whose bound would pass max_age is dead-lettered even when a lower slot was
    drawn: no command is ever kept waiting past the age budget."""
    # 71 s old, next tier 30 s: the lowest slot (15 s) would fit, the bound does not.
    decision = decide(JITTERED, Disposition.TRANSIENT, attempt=3, age_seconds=71.0, draw=draw)
    assert decision == DeadLetter(GiveUp.AGE_EXHAUSTED)
    fits = decide(JITTERED, Disposition.TRANSIENT, attempt=3, age_seconds=70.0, draw=draw)
    assert isinstance(fits, Retry)


@pytest.mark.parametrize("draw", [-0.1, 1.0, 1.5, math.nan, math.inf])
def test_a_draw_outside_zero_to_one_is_a_bug(draw: float) -> None:
    """The caller draws in [0, 1); anything else is refused, not silently clamped."""
    with pytest.raises(ValueError, match="draw must be in"):
        decide(JITTERED, Disposition.TRANSIENT, attempt=1, age_seconds=0.0, draw=draw)


@pytest.mark.parametrize("policy", [POLICY, JITTERED])
def test_decide_never_loops_forever(policy: RetryPolicy) -> None:
    """Following the decisions from attempt 1, waiting each bound, always ends in a dead
    letter."""
    attempt, age = 1, 0.0
    for _ in range(100):
        decision = decide(
            policy, Disposition.TRANSIENT, attempt=attempt, age_seconds=age, draw=LAST_DRAW / 2
        )
        if isinstance(decision, DeadLetter):
            break
        age += decision.bound_seconds
        attempt = decision.next_attempt
    else:
        pytest.fail("retries never ended")
    assert attempt <= policy.max_attempts


@pytest.mark.parametrize(
    ("returned", "then"),
    [
        (0, Requeue(1.0)),
        (1, Requeue(2.0)),
        (2, Requeue(4.0)),
        (3, Requeue(8.0)),
        (REFUSAL_LIMIT - 1, Reject(f"copy refused {REFUSAL_LIMIT} times: nacked")),
        (40, Reject("copy refused 41 times: nacked")),
    ],
)
def test_a_refused_copy_returns_the_delivery_with_a_growing_pause_then_rejects_it(
    returned: int, then: Requeue | Reject
) -> None:
    """A delivery whose copy the broker refused goes back after 1, 2, 4, 8 s; the one that
    would be returned for the REFUSAL_LIMIT-th time is rejected for good instead."""
    assert after_refusal(returned, "nacked") == then


def test_a_copy_carries_its_next_attempt_or_its_verdict() -> None:
    """A retry's copy says which attempt it will be; a dead letter's says the attempt that
    failed, why it gave up and when it was last seen; both carry the history."""

    def headers(decision: Retry | DeadLetter) -> dict[str, object]:
        return copy_headers(
            decision,
            attempt=3,
            first_seen_ms=1000,
            error_class="db.timeout",
            reason="timed out",
            worker="w1",
            now_ms=5000,
        )

    retry = headers(Retry(delay_ms=5000, bound_seconds=5, next_attempt=4))
    assert retry == {
        "x-expiry-first-seen": 1000,
        "x-expiry-error-class": "db.timeout",
        "x-expiry-reason": "timed out",
        "x-expiry-worker": "w1",
        "x-expiry-attempt": 4,
    }
    dead = headers(DeadLetter(GiveUp.ATTEMPTS_EXHAUSTED))
    assert dead["x-expiry-attempt"] == 3
    assert dead["x-expiry-give-up"] == "attempts-exhausted"
    assert dead["x-expiry-last-seen"] == 5000
