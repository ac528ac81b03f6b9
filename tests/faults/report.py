"""Each scenario's figures: printed at its end and summed up after the session."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.faults.checks import Outcome, verify
from tests.faults.scenario import Finished
from tests.faults.services import LogStats
from tests.faults.workload import Workload
from tests.faults.world import World

RESULTS: list[Figures] = []


@dataclass
class Figures:
    """What a scenario did: holds, wall time, deliveries, duplicates, retries, dead letters."""

    scenario: str
    holds: int
    seconds: float
    deliveries: int
    duplicates: int
    retries: int
    dead_letters: int
    extra: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        """One line: ``name: holds=... seconds=... ...``."""
        facts = {
            "holds": self.holds,
            "seconds": f"{self.seconds:.1f}",
            "deliveries": self.deliveries,
            "duplicates": self.duplicates,
            "retries": self.retries,
            "dead_letters": self.dead_letters,
            **self.extra,
        }
        return f"{self.scenario}: " + " ".join(f"{k}={v}" for k, v in facts.items())


def report(
    scenario: str,
    *,
    holds: int,
    seconds: float,
    stats: LogStats,
    dead_letters: int,
    **extra: Any,
) -> Figures:
    """Build, print and remember a scenario's figures."""
    figures = Figures(
        scenario=scenario,
        holds=holds,
        seconds=seconds,
        deliveries=stats.deliveries,
        duplicates=stats.duplicates,
        retries=stats.retries,
        dead_letters=dead_letters,
        extra=extra,
    )
    RESULTS.append(figures)
    print(f"\nFIGURES {figures.line()}", flush=True)
    return figures


@dataclass(frozen=True)
class Checked:
    """A scenario's run that passed the invariant check: what the check found and what the
    consumers logged, for the scenario's own assertions and its figures."""

    workload: Workload
    seconds: float
    outcome: Outcome
    stats: LogStats

    def report(self, scenario: str, **extra: Any) -> Figures:
        """``report`` the run's figures, with the scenario's ``extra`` facts."""
        return report(
            scenario,
            holds=self.workload.holds,
            seconds=self.seconds,
            stats=self.stats,
            dead_letters=len(self.outcome.dead_letters),
            **extra,
        )


async def check_run(world: World, workload: Workload, end: Finished) -> Checked:
    """``verify`` a run whose processes have all stopped, then read what its consumers
    logged."""
    outcome = await verify(world, end.expect, settled=end.settled)
    return Checked(workload, end.seconds, outcome, world.fleet.consumer_stats())
