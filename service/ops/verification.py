"""The exactly-once proof, from the database alone.

Checks that every ``expired`` reservation has exactly one expiring transition
in the audit trail, that nothing left ``expired`` or ``consumed``, that nothing
was expired before its deadline, and that no due ``held`` reservation was left
without a live publish lease by a scan pass that succeeded after it became due.
A due hold that no such pass has covered yet awaits a scan: not a violation,
not proven either. And the outbox's promise (docs/design.md, "Events"): every expiry
since the outbox exists has exactly one event, pending or sent, no event lacks its
expiry, and none stays pending longer than ``PENDING_BOUND_SECONDS`` (an hour, or the
relay's lease and the events' objective when they add up to more). The verdict holds
the counts, the violations of each check and what awaits a scan, as lines (the verdict
first) or as JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from service.adapters import postgres
from service.adapters.postgres.audit_trail import (
    EVENT_CHECKS,
    AwaitingScan,
    EventTotals,
    awaiting_scan,
    event_totals,
    proven_since,
    verify_event_check,
)
from service.adapters.postgres.leases import ScanPass, last_passes
from service.core.durations import human

EXIT_PROVEN = 0
EXIT_VIOLATIONS = 1
EXIT_AWAITING_SCAN = 4
EXIT_NOT_MIGRATED = 5
NOTHING_AWAITS = AwaitingScan(0, None, None)
# A pending event older than this is a violation: no relay has published it for an hour
# (status and the alert say so after EXPIRY_EVENTS_OBJECTIVE_SECONDS; verify, run after
# an incident while the relays catch up, names what is stuck, not a backlog in progress).
PENDING_BOUND_SECONDS = 3600.0


def pending_bound(*, lease_seconds: float, objective_seconds: float) -> float:
    """The age past which a pending event is a violation: an hour, or a relay's lease
    (it may hold an event that long before another takes it) plus the objective."""
    return max(PENDING_BOUND_SECONDS, lease_seconds + objective_seconds)


@dataclass(frozen=True)
class Verdict:
    """The totals, the violations of each check (each list at most ``limit`` long), the due
    holds that await a scan, and the newest scan pass (None: none recorded)."""

    totals: dict[str, int]
    violations: dict[str, list[tuple[str, str]]]  # check -> (reservation id, fact)
    limit: int
    awaiting: AwaitingScan = NOTHING_AWAITS
    last_pass: ScanPass | None = None
    since: datetime | None = None  # where the audit trail begins (retention); None: always
    events: EventTotals | None = None  # the outbox's counts and window (None: not read)

    @property
    def failed(self) -> bool:
        return any(self.violations.values())

    @property
    def proven(self) -> bool:
        return not self.failed and not self.awaiting.holds

    @property
    def exit_code(self) -> int:
        """1 on any violation; else 4 while due holds await a scan; else 0."""
        if self.failed:
            return EXIT_VIOLATIONS
        return EXIT_AWAITING_SCAN if self.awaiting.holds else EXIT_PROVEN

    @property
    def state(self) -> str:
        if self.failed:
            return "violated"
        return "awaiting-scan" if self.awaiting.holds else "proven"

    def as_json(self) -> dict[str, Any]:
        """The machine form (``ok``: no violation)."""
        due = self.awaiting.oldest_due
        scan = self.last_pass
        return {
            "ok": not self.failed,
            "proven": self.proven,
            "state": self.state,
            "verdict": self.verdict(),
            "totals": self.totals,
            "proven_since": self.since.isoformat() if self.since is not None else None,
            "events": None if self.events is None else events_json(self.events),
            "violations": self.violations,
            "awaiting_scan": {
                "holds": self.awaiting.holds,
                "oldest_due": due.isoformat() if due is not None else None,
                "oldest_due_seconds": self.awaiting.oldest_due_seconds,
            },
            "last_pass": None
            if scan is None
            else {
                "scanner": scan.scanner,
                "finished_at": scan.finished_at.isoformat(),
                "age_seconds": scan.age_seconds,
                "result": scan.result,
            },
        }

    def lines(self) -> list[str]:
        """The verdict, the counts, each check with its violations, what awaits a scan."""
        lines = [self.verdict()]
        lines.append("reservations: " + ", ".join(f"{k} {v}" for k, v in self.totals.items()))
        lines.append(self._window())
        if self.events is not None:
            lines.append(events_line(self.events))
        for name, found in self.violations.items():
            more = "+" if len(found) >= self.limit else ""
            mark = f"{len(found)}{more} VIOLATION(S)" if found else "ok"
            lines.append(f"{name:42} {mark}")
            lines += [f"    {reservation_id}  {fact}" for reservation_id, fact in found]
        if self.awaiting.holds and self.failed:
            lines.append(self._awaiting())
        return lines

    def verdict(self) -> str:
        """The first line."""
        if self.failed:
            broken = ", ".join(
                f"{name} ({len(found)})" for name, found in self.violations.items() if found
            )
            return f"verify: FAILED: {broken}; verify --json lists the reservations"
        if self.awaiting.holds:
            return f"verify: no violation, but not proven yet: {self._awaiting()}"
        if self.totals.get("expired_before_window", 0) and self.since is not None:
            return (
                "verify: every effect in the window happened exactly once (holds due since "
                f"{self.since.isoformat(timespec='seconds')}; older ones are past retention)"
            )
        return "verify: every effect happened exactly once"

    def _window(self) -> str:
        if self.since is None:
            return "window: the whole audit trail"
        before = self.totals.get("expired_before_window", 0)
        return (
            f"window: holds due since {self.since.isoformat(timespec='seconds')}, where the "
            f"audit trail begins (retention keeps EXPIRY_RETENTION_DAYS); {before} expired "
            "hold(s) due before it are beyond what verify can prove"
        )

    def _awaiting(self) -> str:
        due = self.awaiting.oldest_due
        since = (
            f", due since {due.isoformat(timespec='seconds')} "
            f"({human(self.awaiting.oldest_due_seconds or 0.0)} ago)"
            if due is not None
            else ""
        )
        return (
            f"{self.awaiting.holds} due hold(s) await a scan{since}; {self._last_pass()}; "
            "run the scan (python -m service.produce --scan) and verify again"
        )

    def _last_pass(self) -> str:
        scan = self.last_pass
        if scan is None:
            return "last scan pass: never"
        return f"last scan pass ended {human(scan.age_seconds)} ago: {scan.result} ({scan.scanner})"


def events_line(events: EventTotals) -> str:
    """The outbox's counts, and since when each expiry must have its event."""
    oldest = events.oldest_pending_seconds
    waiting = f" (the oldest {human(oldest)} old)" if oldest is not None else ""
    since = (
        f"the expiries since {events.since.isoformat(timespec='seconds')}"
        if events.since is not None
        else "every expiry"
    )
    return (
        f"events: sent {events.sent}, pending {events.pending}{waiting}; checked for "
        f"{since} (the outbox's start, or where the audit trail or the record of sent "
        "events begins, whichever is last)"
    )


def events_json(events: EventTotals) -> dict[str, Any]:
    """The same as data."""
    return {
        "pending": events.pending,
        "sent": events.sent,
        "oldest_pending_seconds": events.oldest_pending_seconds,
        "checked_since": events.since.isoformat() if events.since is not None else None,
    }


async def verify(
    conn: postgres.Connection,
    *,
    limit: int,
    scan_interval: float,
    pending_bound: float = PENDING_BOUND_SECONDS,
) -> Verdict:
    """Run every check in one read-only, repeatable-read transaction."""
    async with postgres.transaction(conn, isolation="repeatable_read", readonly=True):
        await postgres.prepare_verification(conn)
        totals = await postgres.verify_totals(conn)
        violations = {
            name: [
                (str(rid), fact)
                for rid, fact in await postgres.verify_check(
                    conn, name, limit=limit, scan_interval=scan_interval
                )
            ]
            for name in postgres.VERIFY_CHECKS
        }
        for name in EVENT_CHECKS:
            found = await verify_event_check(conn, name, limit=limit, pending_bound=pending_bound)
            violations[name] = [(str(rid), fact) for rid, fact in found]
        awaiting = await awaiting_scan(conn, scan_interval=scan_interval)
        newest = await last_passes(conn, 1)
        since = await proven_since(conn)
        events = await event_totals(conn)
    scan = newest[0] if newest else None
    return Verdict(totals, violations, limit, awaiting, scan, since, events)
