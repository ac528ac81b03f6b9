"""The login throttle's arithmetic: a delay that grows, a lock at the threshold that lifts
by itself, counted per name and place, per name and per address; a device-cookie browser
apart."""

from __future__ import annotations

from service.core.login_throttle import Attempt, Policy, Trial, Verdict, decide

POLICY = Policy(attempts=10, lock_seconds=900)
ALICE_HERE = Trial("alice", "10.0.0.1", device=False)


def _failures(count: int, *, name: str = "alice", client: str = "10.0.0.1", device: bool = False,
              start: float = 0.0) -> list[Attempt]:  # fmt: skip
    return [Attempt(name, client, device, "failed", start + i) for i in range(count)]


def test_the_first_failures_are_free_then_the_wait_doubles_up_to_a_minute() -> None:
    waits = []
    for count in range(0, 10):
        attempts = _failures(count)
        now = attempts[-1].at if attempts else 0.0
        waits.append(decide(POLICY, ALICE_HERE, attempts, now).wait_seconds)
    assert waits == [0, 0, 0, 1, 2, 4, 8, 16, 32, 60]


def test_the_threshold_locks_and_the_lock_lifts_by_itself() -> None:
    attempts = _failures(10)
    last = attempts[-1].at
    locked = decide(POLICY, ALICE_HERE, attempts, last + 1)
    assert not locked.allowed
    assert locked.wait_seconds == 899
    assert locked.message() == (
        "too many failed logins for this name from this address: try again in 14m 59s"
    )
    assert decide(POLICY, ALICE_HERE, attempts, last + 900).allowed
    assert decide(POLICY, ALICE_HERE, attempts, last + 900) == Verdict()


def test_a_success_clears_its_place_and_refusals_never_count() -> None:
    attempts = [*_failures(9), Attempt("alice", "10.0.0.1", False, "ok", 20.0)]
    assert decide(POLICY, ALICE_HERE, attempts, 21.0).allowed
    refused = [Attempt("alice", "10.0.0.1", False, "refused", float(i)) for i in range(500)]
    assert decide(POLICY, ALICE_HERE, refused, 500.0).allowed


def test_other_addresses_are_not_slowed_by_one_address_guessing() -> None:
    attempts = _failures(10, client="203.0.113.9")
    assert decide(POLICY, ALICE_HERE, attempts, 10.0).allowed


def test_guessing_one_name_from_many_addresses_locks_the_name_for_a_third_of_the_time() -> None:
    attempts = [Attempt("alice", f"203.0.113.{i}", False, "failed", float(i)) for i in range(30)]
    verdict = decide(POLICY, ALICE_HERE, attempts, 29.0)
    assert (verdict.wait_seconds, verdict.why) == (300.0, "too many failed logins for this name")


def test_a_browser_with_the_operators_device_cookie_is_not_locked_out_by_others() -> None:
    spread = [Attempt("alice", f"203.0.113.{i}", False, "failed", float(i)) for i in range(30)]
    sprayed = _failures(30, name="someone", client="10.0.0.1")
    mine = Trial("alice", "10.0.0.1", device=True)
    assert decide(POLICY, mine, spread + sprayed, 30.0).allowed
    own = _failures(10, device=True, client="198.51.100.7")
    assert not decide(POLICY, mine, own, 10.0).allowed  # its own failures still count


def test_spraying_many_names_from_one_address_locks_the_address() -> None:
    attempts = [Attempt(f"user{i}", "10.0.0.1", False, "failed", float(i)) for i in range(30)]
    verdict = decide(POLICY, ALICE_HERE, attempts, 29.0)
    assert (verdict.wait_seconds, verdict.why) == (
        900.0,
        "too many failed logins from this address",
    )
    elsewhere = Trial("alice", "10.0.0.2", device=False)
    assert decide(POLICY, elsewhere, attempts, 29.0).allowed


def test_a_short_lock_caps_the_delay() -> None:
    policy = Policy(attempts=5, lock_seconds=3)
    attempts = _failures(4)
    assert decide(policy, ALICE_HERE, attempts, 3.0).wait_seconds == 1.0
    assert not decide(policy, ALICE_HERE, _failures(5), 4.5).allowed
    assert decide(policy, ALICE_HERE, _failures(5), 7.0).allowed
