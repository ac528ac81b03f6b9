"""The exactly-once proof, from the database alone.

Checks that every ``expired`` reservation has exactly one expiring transition
in the audit trail, that nothing left ``expired`` or ``consumed``, that nothing
was expired before its deadline, and that every due ``held`` reservation has a
live publish lease or became due within the scan interval. The verdict holds
the counts and the violations of each check, as lines or as JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.adapters import postgres


@dataclass(frozen=True)
class Verdict:
    """The totals, and the violations of each check (each list at most ``limit`` long)."""

    totals: dict[str, int]
    violations: dict[str, list[tuple[str, str]]]  # check -> (reservation id, fact)
    limit: int

    @property
    def failed(self) -> bool:
        return any(self.violations.values())

    def as_json(self) -> dict[str, Any]:
        """The machine form."""
        return {"ok": not self.failed, "totals": self.totals, "violations": self.violations}

    def lines(self) -> list[str]:
        """The counts, each check with its violations, and the verdict."""
        lines = ["reservations: " + ", ".join(f"{k} {v}" for k, v in self.totals.items())]
        for name, found in self.violations.items():
            more = "+" if len(found) >= self.limit else ""
            mark = f"{len(found)}{more} VIOLATION(S)" if found else "ok"
            lines.append(f"{name:42} {mark}")
            lines += [f"    {reservation_id}  {fact}" for reservation_id, fact in found]
        lines.append(
            "verify: FAILED" if self.failed else "verify: every effect happened exactly once"
        )
        return lines


async def verify(conn: postgres.Connection, *, limit: int, scan_interval: float) -> Verdict:
    """Run every check in one read-only, repeatable-read transaction."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
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
    return Verdict(totals, violations, limit)
