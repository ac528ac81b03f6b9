"""The on-call's screen: the oldest due hold, the backlog, the queues, the dead letters.

The age of the oldest due hold (the number to alert on), the due backlog by
deadline age, the depth and consumers of every queue, and open dead letters by
error class; as text (``render``) or JSON (``as_json``). The database's view is
required; the broker's is reported as unreachable (``broker_error``) when it
cannot be read.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiormq.exceptions
from aio_pika.abc import AbstractConnection

from service.adapters import postgres
from service.adapters.amqp.queues import QueueProbe
from service.adapters.metrics import Backlog
from service.adapters.postgres import ownership
from service.core.redaction import redact
from service.core.topology import build_topology
from service.settings import Settings

EXIT_BROKEN = 1
EXIT_OBJECTIVE_MISSED = 3
# What reading the queues raises when the broker cannot be reached or read.
BROKER_ERRORS = (OSError, aiormq.exceptions.AMQPError, TimeoutError)


@dataclass
class QueueState:
    """One queue as the broker sees it (ready messages; unacked ones show in the UI)."""

    name: str
    ready: int | None
    consumers: int | None


@dataclass
class Status:
    """Everything the screen shows."""

    at: str
    objective_seconds: float
    backlog: Backlog
    dead_letters_by_class: dict[str, int]
    parked_holds: int = 0  # held, due or not, their dead letter closed: the scan leaves them
    queues: list[QueueState] = field(default_factory=list)
    broker_error: str | None = None

    @property
    def objective_met(self) -> bool:
        return self.backlog.oldest_due_age_seconds <= self.objective_seconds

    @property
    def exit_code(self) -> int:
        """1 when the broker could not be read, 3 when the objective is missed, else 0."""
        if self.broker_error:
            return EXIT_BROKEN
        return 0 if self.objective_met else EXIT_OBJECTIVE_MISSED


async def read_database(conn: postgres.Connection, settings: Settings) -> Status:
    """The database's part of the screen (no queues yet)."""
    return Status(
        at=datetime.now(UTC).isoformat(timespec="seconds"),
        objective_seconds=settings.oldest_due_objective_seconds,
        backlog=await postgres.backlog(conn),
        dead_letters_by_class=await postgres.dead_letters_by_class(conn),
        parked_holds=await ownership.parked_count(conn),
    )


async def read_queues(
    connection: AbstractConnection, retry_delays: tuple[int, ...]
) -> list[QueueState]:
    """Depth and consumers of every queue of the topology (passive declares)."""
    probe = QueueProbe(connection)
    states = []
    try:
        for spec in build_topology(retry_delays).queues:
            found = await probe.counts(spec.name)
            if found is None:
                states.append(QueueState(spec.name, None, None))
            else:
                states.append(QueueState(spec.name, found.ready, found.consumers))
    finally:
        await probe.close()
    return states


def describe(exc: BaseException) -> str:
    """``Type: message`` of ``exc``, redacted (the broker's errors may quote a URL)."""
    text = str(exc).strip()
    return redact(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


def render(status: Status) -> str:
    """The human screen."""
    backlog = status.backlog
    verdict = "OK" if status.objective_met else "ALERT: older than the objective"
    lines = [
        f"expiry status at {status.at}"
        f"   objective: oldest due hold <= {status.objective_seconds:g}s",
        "",
        f"oldest due hold   {backlog.oldest_due_age_seconds:9.1f}s   {verdict}",
        f"due backlog       {backlog.total:9d}    "
        + ", ".join(f"{bucket}: {count}" for bucket, count in backlog.by_bucket.items()),
        f"parked holds      {status.parked_holds:9d}    (dead letters closed: not scanned)",
        "",
        f"{'queue':28} {'ready':>8} {'consumers':>10}",
    ]
    if status.broker_error:
        lines.append(f"broker unreachable: {status.broker_error}")
    for queue in status.queues:
        ready = "missing" if queue.ready is None else str(queue.ready)
        consumers = "-" if queue.consumers is None else str(queue.consumers)
        lines.append(f"{queue.name:28} {ready:>8} {consumers:>10}")
    lines += ["", "open dead letters by error class:"]
    lines += [f"  {name:26} {count:>6}" for name, count in status.dead_letters_by_class.items()]
    if not status.dead_letters_by_class:
        lines.append("  none")
    return "\n".join(lines)


def as_json(status: Status) -> dict[str, Any]:
    """The machine form."""
    data = asdict(status)
    data["backlog"]["total"] = status.backlog.total
    data["objective_met"] = status.objective_met
    return data
