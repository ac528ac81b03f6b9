"""What the on-call's view can find wrong (``health.py`` decides which): each condition,
its exit code, the verdicts, and the commands the advice names.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from service.core.topology import RETRY_EXCHANGE

EXIT_OK = 0
EXIT_UNREACHABLE = 1
EXIT_OBJECTIVE_MISSED = 3
EXIT_DEGRADED = 4
EXIT_NOT_SET_UP = 5
# The most severe first: the exit code and the verdict are the most severe problem's.
SEVERITY = (EXIT_UNREACHABLE, EXIT_NOT_SET_UP, EXIT_OBJECTIVE_MISSED, EXIT_DEGRADED)
VERDICTS = {
    EXIT_OK: "OK",
    EXIT_UNREACHABLE: "DOWN",
    EXIT_NOT_SET_UP: "NOT SET UP",
    EXIT_OBJECTIVE_MISSED: "ALERT",
    EXIT_DEGRADED: "DEGRADED",
}
MIGRATE_COMMAND = "python -m service.migrate"
DECLARE_COMMAND = "python -m service.declare"
RETENTION_COMMAND = "python -m service.retention"
RELAY_COMMAND = "python -m service.relay"
DELIVER_COMMAND = "python -m service.deliver"
RETRY_QUEUES = f"{RETRY_EXCHANGE}."


class Condition(StrEnum):
    """A problem a deployment can have, as ``--json`` names it."""

    DATABASE_UNREACHABLE = "database-unreachable"
    BROKER_UNREACHABLE = "broker-unreachable"
    NOT_MIGRATED = "not-migrated"
    TOPOLOGY_NOT_DECLARED = "topology-not-declared"
    OBJECTIVE_BREACHED = "objective-breached"
    NO_CONSUMER = "no-consumer"
    NO_SCAN_YET = "no-scan-yet"
    SCANNER_STOPPED = "scanner-stopped"
    SCAN_FAILING = "scan-failing"
    PARTITIONS_RUNNING_OUT = "partitions-running-out"
    RETENTION_NOT_RUN = "retention-not-run"
    EVENTS_BEHIND = "events-behind"
    WEBHOOKS_BEHIND = "webhooks-behind"
    WEBHOOK_PAUSED = "webhook-paused"
    WEBHOOK_DISABLED = "webhook-disabled"


EXIT_CODES = {
    Condition.DATABASE_UNREACHABLE: EXIT_UNREACHABLE,
    Condition.BROKER_UNREACHABLE: EXIT_UNREACHABLE,
    Condition.NOT_MIGRATED: EXIT_NOT_SET_UP,
    Condition.TOPOLOGY_NOT_DECLARED: EXIT_NOT_SET_UP,
    Condition.OBJECTIVE_BREACHED: EXIT_OBJECTIVE_MISSED,
    Condition.NO_CONSUMER: EXIT_DEGRADED,
    Condition.NO_SCAN_YET: EXIT_DEGRADED,
    Condition.SCANNER_STOPPED: EXIT_DEGRADED,
    Condition.SCAN_FAILING: EXIT_DEGRADED,
    Condition.PARTITIONS_RUNNING_OUT: EXIT_OBJECTIVE_MISSED,
    Condition.RETENTION_NOT_RUN: EXIT_DEGRADED,
    # The events' objective missed, as the oldest due hold's is: a promise kept late.
    Condition.EVENTS_BEHIND: EXIT_OBJECTIVE_MISSED,
    Condition.WEBHOOKS_BEHIND: EXIT_OBJECTIVE_MISSED,
    Condition.WEBHOOK_PAUSED: EXIT_DEGRADED,
    Condition.WEBHOOK_DISABLED: EXIT_DEGRADED,
}
# Retention: partitions must reach a week past now, and a run succeed once a day (counted
# from when retention began, for a deployment that has never run it).


@dataclass(frozen=True)
class Problem:
    """One thing found wrong: what it is, what it means, what to do."""

    condition: Condition
    summary: str
    meaning: str
    todo: str

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.condition]

    @property
    def line(self) -> str:
        """The problem in one line."""
        return f"{self.summary}: {self.meaning}. {self.todo}."
