"""The retry policy a dead letter was recorded under, and what a replay changes: pure.

The recorder keeps with each record (``dead_letters.policy``) the policy of the
consumer that recorded it, never one read from the message (its headers are
untrusted): the backoff tiers, their jitter, the attempt and age budgets and the
work queue's delivery limit. A replay starts afresh under today's policy;
``changes`` says, one line each, what differs and what that means for the replay,
and ``describe`` puts a policy in one line for people.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from service.core.durations import human
from service.core.errors import Disposition
from service.core.inputs import MAX_ATTEMPT, MAX_DELIVERY_COUNT, bounded_int
from service.core.retry import DeadLetter, GiveUp, RetryPolicy, decide
from service.core.topology import DELIVERY_LIMIT

UNKNOWN = (
    "the policy it was dead-lettered under is not known (recorded before this version): "
    "the replay runs under today's"
)
JSON_LIMIT = 4096  # far above any policy we write
MAX_TIERS = 64
MAX_SECONDS = 10**9
MAX_SLOTS = 1000
BUDGET_GIVE_UPS = (GiveUp.ATTEMPTS_EXHAUSTED, GiveUp.AGE_EXHAUSTED)


class PolicySource(Protocol):
    """Where today's policy is read from (``Settings``)."""

    @property
    def retry_delays(self) -> tuple[int, ...]: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def max_age_seconds(self) -> int: ...
    @property
    def retry_jitter(self) -> float: ...
    @property
    def retry_jitter_slots(self) -> int: ...


@dataclass(frozen=True)
class Policy:
    """The retry policy in force where a dead letter was recorded.

    ``None`` in an optional field means it was not recorded (an older version).
    """

    delays: tuple[int, ...]
    max_attempts: int
    max_age_seconds: int
    delivery_limit: int | None = None
    jitter: float | None = None
    jitter_slots: int | None = None

    @property
    def retry(self) -> RetryPolicy:
        """The part the retry decision uses (no jitter where none was recorded)."""
        return RetryPolicy(
            self.delays,
            self.max_attempts,
            self.max_age_seconds,
            jitter=self.jitter or 0.0,
            slots=self.jitter_slots or 1,
        )

    def as_json(self) -> str:
        """The stored form: a JSON object named after the settings (optional fields only
        when known)."""
        stored: dict[str, Any] = {
            "retry_delays": list(self.delays),
            "max_attempts": self.max_attempts,
            "max_age_seconds": self.max_age_seconds,
        }
        optional = {
            "delivery_limit": self.delivery_limit,
            "retry_jitter": self.jitter,
            "retry_jitter_slots": self.jitter_slots,
        }
        stored |= {key: value for key, value in optional.items() if value is not None}
        return json.dumps(stored, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, value: object) -> Policy | None:
        """The policy of a stored value (JSON text or an already decoded object); None when
        there is none or it cannot be read (never raises)."""
        stored = _decoded(value)
        if stored is None:
            return None
        delays = _delays(stored.get("retry_delays"))
        max_attempts = bounded_int(stored.get("max_attempts"), 1, MAX_ATTEMPT)
        max_age = bounded_int(stored.get("max_age_seconds"), 1, MAX_SECONDS)
        if delays is None or max_attempts is None or max_age is None:
            return None
        return cls(
            delays=delays,
            max_attempts=max_attempts,
            max_age_seconds=max_age,
            delivery_limit=bounded_int(stored.get("delivery_limit"), 1, MAX_DELIVERY_COUNT),
            jitter=_fraction(stored.get("retry_jitter")),
            jitter_slots=bounded_int(stored.get("retry_jitter_slots"), 1, MAX_SLOTS),
        )


def policy_in_force(settings: PolicySource) -> Policy:
    """The policy these settings give, with the work queue's delivery limit."""
    return Policy(
        delays=tuple(settings.retry_delays),
        max_attempts=settings.max_attempts,
        max_age_seconds=settings.max_age_seconds,
        delivery_limit=DELIVERY_LIMIT,
        jitter=settings.retry_jitter,
        jitter_slots=settings.retry_jitter_slots,
    )


def _decoded(value: object) -> Mapping[str, Any] | None:
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("utf-8", "replace")
    if isinstance(value, str):
        if len(value) > JSON_LIMIT:
            return None
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return None
    return value if isinstance(value, dict) else None


def _delays(value: object) -> tuple[int, ...] | None:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_TIERS:
        return None
    delays = [bounded_int(item, 1, MAX_SECONDS) for item in value]
    return tuple(d for d in delays if d is not None) if None not in delays else None


def _fraction(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) and 0 <= number <= 1 else None


# -- for people ---------------------------------------------------------------------


def _span(seconds: float) -> str:
    return f"{round(seconds, 1):g}s" if seconds < 60 else human(seconds)


def _delays_text(delays: tuple[int, ...]) -> str:
    return ", ".join(_span(d) for d in delays)


def _jitter_text(policy: Policy) -> str:
    """The jitter as it worked: none when it was not recorded (there was none then)."""
    if not policy.jitter or (policy.jitter_slots or 1) < 2:
        return "none"
    return f"{policy.jitter:g} over {policy.jitter_slots} slots"


def describe(policy: Policy | None) -> str:
    """The policy in one line, or that it is not known."""
    if policy is None:
        return "not known (recorded before this version)"
    jitter = "" if policy.jitter is None else f" (jitter: {_jitter_text(policy)})"
    limit = (
        ""
        if policy.delivery_limit is None
        else f"; the work queue dead-letters after {policy.delivery_limit} deliveries"
    )
    return (
        f"retry after {_delays_text(policy.delays)}{jitter}; at most {policy.max_attempts} "
        f"attempts within {_span(policy.max_age_seconds)}{limit}"
    )


def changes(
    recorded: Policy | None,
    current: Policy,
    *,
    give_up: str | None = None,
    attempts: int | None = None,
    age_seconds: float | None = None,
) -> list[str]:
    """What differs between the recorded policy and today's, one line each with what it
    changes for a replay; empty when nothing does.

    With the record's ``give_up`` (attempts or age exhausted), its ``attempts`` and its
    age when it gave up, a last line says whether today's budget would have given up too.
    """
    if recorded is None:
        return [UNKNOWN]
    lines = [
        line
        for line in (
            _delays_change(recorded, current),
            _attempts_change(recorded, current),
            _age_change(recorded, current),
            _jitter_change(recorded, current),
            _limit_change(recorded, current),
        )
        if line
    ]
    if lines and give_up in BUDGET_GIVE_UPS and attempts is not None:
        lines.append(_verdict(current, str(give_up), attempts, age_seconds or 0.0))
    return lines


def changes_for_record(record: Mapping[str, Any], current: Policy) -> list[str]:
    """``changes`` for a ``dead_letters`` row (its ``policy``, ``give_up``, ``attempts``,
    and the span from ``first_seen`` to ``last_seen`` as its age when it gave up)."""
    first, last = record.get("first_seen"), record.get("last_seen")
    age = None
    if isinstance(first, datetime) and isinstance(last, datetime):
        age = max(0.0, (last - first).total_seconds())
    return changes(
        Policy.from_json(record.get("policy")),
        current,
        give_up=record.get("give_up"),
        attempts=bounded_int(record.get("attempts"), 1, MAX_ATTEMPT),
        age_seconds=age,
    )


def _delays_change(recorded: Policy, current: Policy) -> str | None:
    if recorded.delays == current.delays:
        return None
    *first, last = current.delays
    waits = f"{_delays_text(tuple(first))}, then {_span(last)}" if first else _span(last)
    return (
        f"retry delays {_delays_text(recorded.delays)} -> {_delays_text(current.delays)}: "
        f"a replay that fails again waits {waits} before each further attempt"
    )


def _attempts_change(recorded: Policy, current: Policy) -> str | None:
    if recorded.max_attempts == current.max_attempts:
        return None
    return (
        f"max attempts {recorded.max_attempts} -> {current.max_attempts}: "
        f"the replay gets today's fresh budget of {current.max_attempts} attempts"
    )


def _age_change(recorded: Policy, current: Policy) -> str | None:
    if recorded.max_age_seconds == current.max_age_seconds:
        return None
    return (
        f"max age {_span(recorded.max_age_seconds)} -> {_span(current.max_age_seconds)}: "
        f"the replay may keep retrying for {_span(current.max_age_seconds)} from when it is "
        "replayed"
    )


def _jitter_change(recorded: Policy, current: Policy) -> str | None:
    before, after = _jitter_text(recorded), _jitter_text(current)
    if before == after or current.jitter is None:
        return None
    if after == "none":
        effect = "each retry of the replay waits its tier's delay exactly"
    else:
        effect = (
            f"each retry of the replay waits between {1 - (current.jitter or 0):.0%} and all "
            "of its tier's delay, spread over the slots"
        )
    return f"retry jitter {before} -> {after}: {effect}"


def _limit_change(recorded: Policy, current: Policy) -> str | None:
    if recorded.delivery_limit is None or recorded.delivery_limit == current.delivery_limit:
        return None
    return (
        f"delivery limit {recorded.delivery_limit} -> {current.delivery_limit}: a replay that "
        f"crashes consumers is dead-lettered by the broker after {current.delivery_limit} "
        "deliveries"
    )


def _verdict(current: Policy, give_up: str, attempts: int, age_seconds: float) -> str:
    """Whether today's budget, at the same attempt and age, would have given up too."""
    decision = decide(
        current.retry, Disposition.TRANSIENT, attempt=attempts, age_seconds=age_seconds, draw=0.0
    )
    head = f"it gave up ({give_up}) at attempt {attempts}, {_span(age_seconds)} after the first"
    if isinstance(decision, DeadLetter):
        return f"{head}: today's budget would have given up too ({decision.why})"
    return (
        f"{head}: today's budget would not have (it would retry within "
        f"{_span(decision.bound_seconds)}, attempt {decision.next_attempt} of "
        f"{current.max_attempts})"
    )
