"""The retry policy kept with a dead letter: stored, read back, described, compared."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from service.core.recorded_policy import (
    UNKNOWN,
    Policy,
    changes,
    changes_for_record,
    describe,
    policy_in_force,
)
from service.core.retry import RetryPolicy
from service.core.topology import DELIVERY_LIMIT
from service.settings import Settings

THEN = Policy(delays=(1, 5, 30, 120), max_attempts=10, max_age_seconds=3600, delivery_limit=10)
NOW = Policy(
    delays=(1, 5, 30, 120),
    max_attempts=10,
    max_age_seconds=3600,
    delivery_limit=10,
    jitter=0.0,
    jitter_slots=8,
)


def test_the_policy_in_force_is_the_settings_and_the_work_queues_delivery_limit() -> None:
    """Delays, budgets and jitter come from the settings; the delivery limit from topology."""
    settings = Settings(
        retry_delays=(2, 4),
        max_attempts=7,
        max_age_seconds=600,
        retry_jitter=0.25,
        retry_jitter_slots=4,
    )
    assert policy_in_force(settings) == Policy(
        delays=(2, 4),
        max_attempts=7,
        max_age_seconds=600,
        delivery_limit=DELIVERY_LIMIT,
        jitter=0.25,
        jitter_slots=4,
    )
    assert policy_in_force(settings).retry == RetryPolicy((2, 4), 7, 600, jitter=0.25, slots=4)


@pytest.mark.parametrize("policy", [THEN, NOW, Policy((3,), 1, 1)])
def test_the_stored_json_reads_back_as_the_same_policy(policy: Policy) -> None:
    """as_json, then from_json (text, or the object a JSON codec would give), is the policy."""
    text = policy.as_json()
    assert Policy.from_json(text) == policy
    assert Policy.from_json(json.loads(text)) == policy
    assert Policy.from_json(text.encode()) == policy


def test_the_stored_json_names_the_settings_and_leaves_out_what_is_unknown() -> None:
    """The keys follow the settings' names; a field not known is left out, not null."""
    assert json.loads(THEN.as_json()) == {
        "retry_delays": [1, 5, 30, 120],
        "max_attempts": 10,
        "max_age_seconds": 3600,
        "delivery_limit": 10,
    }


@pytest.mark.parametrize(
    "stored",
    [
        None,
        "",
        "not json",
        "[1, 2]",
        "null",
        "{}",
        '{"retry_delays": [], "max_attempts": 1, "max_age_seconds": 1}',
        '{"retry_delays": [1, -5], "max_attempts": 1, "max_age_seconds": 1}',
        '{"retry_delays": [1, true], "max_attempts": 1, "max_age_seconds": 1}',
        '{"retry_delays": "1,5", "max_attempts": 1, "max_age_seconds": 1}',
        '{"retry_delays": [1], "max_attempts": 0, "max_age_seconds": 1}',
        '{"retry_delays": [1], "max_attempts": 1.5, "max_age_seconds": 1}',
        '{"retry_delays": [1], "max_attempts": 1}',
        '{"retry_delays": [1], "max_attempts": 1, "max_age_seconds": 1e400}',
        "[" * 100_000,
        '{"retry_delays": [' + "1," * 5000 + "1]}",
        42,
        b"\xff\xfe",
    ],
)
def test_missing_or_garbled_json_reads_as_unknown(stored: object) -> None:
    """from_json never raises: whatever cannot be read is an unknown policy (None)."""
    assert Policy.from_json(stored) is None


def test_garbled_optional_fields_read_as_not_recorded() -> None:
    """A bad jitter or delivery limit loses that field only, not the policy."""
    stored = {
        "retry_delays": [1, 5],
        "max_attempts": 3,
        "max_age_seconds": 60,
        "delivery_limit": "lots",
        "retry_jitter": 7,
        "retry_jitter_slots": -1,
        "someday": "a field of a later version",
    }
    assert Policy.from_json(stored) == Policy((1, 5), 3, 60)


def test_a_policy_is_described_in_one_line() -> None:
    """Delays, jitter, budgets and the delivery limit, as people read them."""
    jittered = Policy((1, 5, 30, 120), 10, 3600, 10, jitter=0.5, jitter_slots=8)
    assert describe(jittered) == (
        "retry after 1s, 5s, 30s, 2m (jitter: 0.5 over 8 slots); at most 10 attempts within "
        "1h; the work queue dead-letters after 10 deliveries"
    )
    assert describe(Policy((2,), 3, 90)) == "retry after 2s; at most 3 attempts within 1m 30s"
    assert describe(None) == "not known (recorded before this version)"
    assert "\n" not in describe(jittered)


def test_an_unknown_recorded_policy_is_one_line_saying_so() -> None:
    """A record from before this version: one line, whatever else is asked."""
    assert changes(None, NOW, give_up="attempts-exhausted", attempts=10) == [UNKNOWN]
    assert "not known (recorded before this version)" in UNKNOWN


def test_the_same_policy_changes_nothing() -> None:
    """Nothing differs: no line, not even a verdict on the budget."""
    assert changes(NOW, NOW, give_up="attempts-exhausted", attempts=10, age_seconds=400) == []
    assert changes(THEN, NOW) == []  # no jitter recorded then is no jitter


def test_each_difference_is_a_line_saying_what_it_changes_for_a_replay() -> None:
    """Delays, attempts, age, jitter and delivery limit: one line each, in that order."""
    today = Policy((1, 10, 60), 20, 7200, 20, jitter=0.5, jitter_slots=8)
    assert changes(THEN, today) == [
        "retry delays 1s, 5s, 30s, 2m -> 1s, 10s, 1m: a replay that fails again waits 1s, "
        "10s, then 1m before each further attempt",
        "max attempts 10 -> 20: the replay gets today's fresh budget of 20 attempts",
        "max age 1h -> 2h: the replay may keep retrying for 2h from when it is replayed",
        "retry jitter none -> 0.5 over 8 slots: each retry of the replay waits between 50% "
        "and all of its tier's delay, spread over the slots",
        "delivery limit 10 -> 20: a replay that crashes consumers is dead-lettered by the "
        "broker after 20 deliveries",
    ]
    assert changes(today, NOW)[3] == (
        "retry jitter 0.5 over 8 slots -> none: each retry of the replay waits its tier's "
        "delay exactly"
    )


def test_an_exhausted_attempt_budget_says_whether_todays_would_have_given_up_too() -> None:
    """Ten attempts spent: under a budget of 20 today it would have retried; of 5, not."""
    more = Policy((1, 5, 30, 120), 20, 3600, 10)
    fewer = Policy((1, 5, 30, 120), 5, 3600, 10)

    def verdict(today: Policy) -> str:
        return changes(THEN, today, give_up="attempts-exhausted", attempts=10, age_seconds=400)[-1]

    assert verdict(more) == (
        "it gave up (attempts-exhausted) at attempt 10, 6m 40s after the first: today's "
        "budget would not have (it would retry within 2m, attempt 11 of 20)"
    )
    assert verdict(fewer) == (
        "it gave up (attempts-exhausted) at attempt 10, 6m 40s after the first: today's "
        "budget would have given up too (attempts-exhausted)"
    )


def test_an_exhausted_age_budget_says_whether_todays_would_have_given_up_too() -> None:
    """An hour spent: a two-hour budget would have waited once more; a shorter one not."""
    longer = Policy((1, 5, 30, 120), 10, 7200, 10)

    def verdict(today: Policy) -> str:
        return changes(THEN, today, give_up="age-exhausted", attempts=6, age_seconds=3550)[-1]

    assert verdict(longer).endswith(
        "today's budget would not have (it would retry within 2m, attempt 7 of 10)"
    )
    shorter = Policy((1, 5, 30, 120), 10, 1800, 10)
    assert verdict(shorter).endswith("today's budget would have given up too (age-exhausted)")


@pytest.mark.parametrize("give_up", ["permanent", "delivery-limit", None])
def test_other_give_ups_get_no_budget_verdict(give_up: str | None) -> None:
    """A permanent error or the broker's verdict does not depend on the retry budget."""
    more = Policy((1, 5, 30, 120), 20, 3600, 10)
    assert changes(THEN, more, give_up=give_up, attempts=10) == [
        "max attempts 10 -> 20: the replay gets today's fresh budget of 20 attempts"
    ]


def test_a_record_row_is_compared_with_its_own_give_up_attempts_and_age() -> None:
    """changes_for_record reads the policy, give-up, attempts and span of a dead_letters row."""
    first = datetime(2026, 1, 1, tzinfo=UTC)
    row = {
        "policy": THEN.as_json(),
        "give_up": "attempts-exhausted",
        "attempts": 10,
        "first_seen": first,
        "last_seen": first + timedelta(seconds=400),
    }
    more = Policy((1, 5, 30, 120), 20, 3600, 10)
    assert changes_for_record(row, more) == changes(
        THEN, more, give_up="attempts-exhausted", attempts=10, age_seconds=400.0
    )
    assert changes_for_record({**row, "policy": None}, more) == [UNKNOWN]
    assert changes_for_record({"policy": THEN.as_json()}, more) == [
        "max attempts 10 -> 20: the replay gets today's fresh budget of 20 attempts"
    ]
