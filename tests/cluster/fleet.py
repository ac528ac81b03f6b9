"""The service's real commands as subprocesses (``tests/faults/services.py``), and
what the cluster test reads from their logs."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any

from tests.faults.services import Fleet as ProcessFleet
from tests.faults.services import ServiceProcess

__all__ = ["Fleet", "ServiceProcess", "event_time"]


def event_time(event: dict[str, Any]) -> datetime | None:
    """The ``ts`` of a JSON log line, if it has one."""
    stamp = event.get("ts")
    return datetime.fromisoformat(stamp) if isinstance(stamp, str) else None


class Fleet(ProcessFleet):
    """The processes of one test; what its consumers logged."""

    def outcomes(self) -> Counter[str]:
        """Every consumer's ``expiry.outcome`` lines, by outcome."""
        return self.consumer_stats().outcomes

    def reservations_with(self, outcome: str) -> set[str]:
        """The reservations for which some consumer logged this outcome."""
        return {
            str(event.get("reservation_id"))
            for event in self.consumer_stats().named("expiry.outcome")
            if event.get("outcome") == outcome
        }

    def count(self, event: str) -> int:
        """How many lines of ``event`` the consumers logged."""
        return len(self.consumer_stats().named(event))
