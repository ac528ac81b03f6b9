"""When a console login may be tried: a delay that grows with each failure, then a
temporary lock, counted three ways (pure: the caller reads the attempts and the clock).

- **one name from one place** (an address, or a browser that shows a device cookie of
  that operator): from the ``FREE``-th failure on, the next try waits 1 s, 2 s, 4 s, ...
  (at most ``MAX_DELAY_SECONDS``); at ``policy.attempts`` failures it is locked for
  ``policy.lock_seconds``;
- **one name from anywhere**: ``SPREAD`` times as many failures lock the name for a third
  of that, except for a browser with a device cookie of that operator, so that guessing
  from many addresses cannot keep a real operator out;
- **one address, any names** (password spraying): ``SPREAD`` times as many failures
  lock the address for ``policy.lock_seconds``, again except for device-cookie browsers.

Only failures of the last ``policy.lock_seconds`` count, and for one place only those
after its last success: a lock lifts by itself and leaves nothing behind. Refused tries
do not count (they would extend a lock for ever).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from service.core.durations import human

FREE = 3
SPREAD = 3
MAX_DELAY_SECONDS = 60.0


@dataclass(frozen=True)
class Policy:
    """``EXPIRY_CONSOLE_LOGIN_ATTEMPTS`` and ``EXPIRY_CONSOLE_LOGIN_LOCK_SECONDS``."""

    attempts: int = 10
    lock_seconds: float = 900.0


@dataclass(frozen=True)
class Attempt:
    """One login tried: the name, from where, with a device cookie of that name or not,
    its outcome (``ok``, ``failed``, ``refused``) and when (seconds, any epoch)."""

    name: str
    client: str
    device: bool
    outcome: str
    at: float


@dataclass(frozen=True)
class Verdict:
    """How long the next try must wait (0: it may go on now), and why."""

    wait_seconds: float = 0.0
    why: str = ""

    @property
    def allowed(self) -> bool:
        return self.wait_seconds <= 0

    def message(self) -> str:
        """What the login page says (the same for a name that exists and one that does not)."""
        return f"{self.why}: try again in {human(max(math.ceil(self.wait_seconds), 1))}"


@dataclass(frozen=True)
class Trial:
    """The login being tried."""

    name: str
    client: str
    device: bool  # the browser shows a device cookie of this name


def decide(policy: Policy, trial: Trial, attempts: Iterable[Attempt], now: float) -> Verdict:
    """The wait before ``trial`` may be checked, given the recent ``attempts``."""
    recent = [a for a in attempts if now - a.at < policy.lock_seconds]
    place = _since_success([a for a in recent if _same_place(a, trial)])
    verdicts = [_place_verdict(policy, place, trial, now)]
    if not trial.device:
        spread = policy.attempts * SPREAD
        account = [a for a in recent if a.name == trial.name and a.outcome == "failed"]
        sprayed = [a for a in recent if a.client == trial.client and not a.device]
        verdicts.append(
            _locked(
                account,
                spread,
                policy.lock_seconds / 3,
                now,
                "too many failed logins for this name",
            )
        )
        verdicts.append(
            _locked(
                [a for a in sprayed if a.outcome == "failed"],
                spread,
                policy.lock_seconds,
                now,
                "too many failed logins from this address",
            )
        )
    return max(verdicts, key=lambda v: v.wait_seconds)


def _same_place(attempt: Attempt, trial: Trial) -> bool:
    if attempt.name != trial.name or attempt.device != trial.device:
        return False
    return trial.device or attempt.client == trial.client


def _since_success(attempts: list[Attempt]) -> list[Attempt]:
    """The failures after the last success."""
    last_ok = max((a.at for a in attempts if a.outcome == "ok"), default=float("-inf"))
    return [a for a in attempts if a.outcome == "failed" and a.at > last_ok]


def _place_verdict(policy: Policy, failures: list[Attempt], trial: Trial, now: float) -> Verdict:
    where = "this browser" if trial.device else "this address"
    why = f"too many failed logins for this name from {where}"
    if len(failures) >= policy.attempts:
        return _locked(failures, policy.attempts, policy.lock_seconds, now, why)
    if len(failures) < FREE:
        return Verdict()
    delay = min(2.0 ** (len(failures) - FREE), MAX_DELAY_SECONDS, policy.lock_seconds)
    last = max(a.at for a in failures)
    return Verdict(last + delay - now, why)


def _locked(
    failures: list[Attempt], threshold: int, seconds: float, now: float, why: str
) -> Verdict:
    if len(failures) < threshold:
        return Verdict()
    return Verdict(max(a.at for a in failures) + seconds - now, why)
