"""The on-call's view of a deployment, and the one place that decides its state.

A ``Status`` holds the database's facts and the broker's (``survey.py`` reads them;
a side that cannot be read is said in it). ``assess`` (pure) turns the facts into
problems, each saying what it means and what to do, and
the most severe one gives the verdict and the exit code. The status command
renders it as text or JSON (``service/ops/screen.py``), the console as a page.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime

from service.adapters.postgres.leases import ScanPass
from service.adapters.postgres.outbox import Pending
from service.adapters.postgres.partitions import Retained
from service.adapters.postgres.webhook_endpoints import EndpointBacklog
from service.adapters.telemetry.readings import Backlog
from service.core.durations import human
from service.core.topology import QUEUE
from service.ops.conditions import (
    DECLARE_COMMAND,
    DELIVER_COMMAND,
    EXIT_OK,
    MIGRATE_COMMAND,
    RELAY_COMMAND,
    RETENTION_COMMAND,
    RETRY_QUEUES,
    SEVERITY,
    VERDICTS,
    Condition,
    Problem,
)

PARTITIONS_AHEAD_MIN_SECONDS = 7 * 86400.0
RETENTION_RUN_MAX_AGE_SECONDS = 86400.0


@dataclass
class QueueState:
    """One queue as the broker sees it (ready messages; unacked ones show in the UI)."""

    name: str
    ready: int | None  # None: the queue does not exist
    consumers: int | None


@dataclass
class Status:
    """The facts read, and what they add up to (``problems``, ``verdict``, ``exit_code``).

    ``backlog`` is None when the database's figures could not be read: then
    ``database_error`` or ``not_migrated`` says why.
    """

    at: str
    objective_seconds: float
    scan_stall_seconds: float  # a scanner whose last pass and page are older is stopped
    backlog: Backlog | None = None
    dead_letters_by_class: dict[str, int] = field(default_factory=dict)
    parked_holds: int = 0  # held, due or not, their dead letter closed: the scan leaves them
    passes: list[ScanPass] = field(default_factory=list)  # the newest first
    newest_publish_age_seconds: float | None = None  # read only when the passes are old
    database_error: str | None = None
    not_migrated: str | None = None  # what is missing
    missing_migrations: list[str] = field(default_factory=list)
    queues: list[QueueState] = field(default_factory=list)
    broker_error: str | None = None
    retention: Retained | None = None  # each table's size, the audit's range, the last run
    retention_began: datetime | None = None  # the migration that brought retention
    events: Pending | None = None  # the outbox's backlog (None: not read)
    events_objective_seconds: float = 60.0  # EXPIRY_EVENTS_OBJECTIVE_SECONDS
    webhooks: list[EndpointBacklog] | None = None  # each registered endpoint's deliveries
    webhook_objective_seconds: float = 300.0  # EXPIRY_WEBHOOK_OBJECTIVE_SECONDS

    @property
    def partitions_ahead_seconds(self) -> float | None:
        """How far the audit tables' partitions reach past now: the shortest."""
        if self.retention is None:
            return None
        return min(self.retention.partitions_ahead_seconds.values(), default=None)

    @property
    def retention_run_age_seconds(self) -> float | None:
        """Since the last successful run (or, never run, since retention began)."""
        if self.retention is None:
            return None
        last = self.retention.last_ok or self.retention_began
        return None if last is None else (self.retention.at - last).total_seconds()

    @property
    def objective_met(self) -> bool | None:
        if self.backlog is None:
            return None
        return self.backlog.oldest_due_age_seconds <= self.objective_seconds

    @property
    def events_objective_met(self) -> bool | None:
        """The oldest pending event within its objective (None: not read)."""
        if self.events is None:
            return None
        return self.events.oldest_age_seconds <= self.events_objective_seconds

    @property
    def open_dead_letters(self) -> int | None:
        return None if self.backlog is None else sum(self.dead_letters_by_class.values())

    @property
    def problems(self) -> list[Problem]:
        return assess(self)

    @property
    def exit_code(self) -> int:
        """The most severe problem's (1 > 5 > 3 > 4), else 0."""
        problems = self.problems
        return problems[0].exit_code if problems else EXIT_OK

    @property
    def verdict(self) -> str:
        """The first line: OK, or the most severe problem (and how many more there are)."""
        problems = self.problems
        if not problems:
            return f"{VERDICTS[EXIT_OK]}: {_all_well(self)}"
        more = len(problems) - 1
        also = f" (and {more} more problem{'s' if more > 1 else ''} below)" if more else ""
        return f"{VERDICTS[problems[0].exit_code]}: {problems[0].summary}{also}"


def assess(status: Status) -> list[Problem]:
    """Every problem the facts show, the most severe first."""
    found = [*_database_problems(status), *_broker_problems(status)]
    if status.backlog is not None:
        found += [*_backlog_problems(status, status.backlog), *_scan_problems(status)]
        found += [*_retention_problems(status), *_events_problems(status)]
        found += _webhook_problems(status)
    return sorted(found, key=lambda problem: SEVERITY.index(problem.exit_code))


def _database_problems(status: Status) -> Iterator[Problem]:
    if status.database_error is not None:
        yield Problem(
            Condition.DATABASE_UNREACHABLE,
            "PostgreSQL cannot be reached",
            f"{status.database_error}; no hold is scanned or expired while it is down",
            "Check the database and DATABASE_URL",
        )
    elif status.not_migrated is not None:
        yield Problem(
            Condition.NOT_MIGRATED,
            "the database is not migrated",
            f"{status.not_migrated}; nothing can be scanned or expired",
            f"Run {MIGRATE_COMMAND} (as the owner of the tables)",
        )


def _broker_problems(status: Status) -> Iterator[Problem]:
    if status.broker_error is not None:
        yield Problem(
            Condition.BROKER_UNREACHABLE,
            "RabbitMQ cannot be reached",
            f"{status.broker_error}; no command is published or delivered while it is down",
            "Check the broker and AMQP_URL",
        )
        return
    missing = [queue.name for queue in status.queues if queue.ready is None]
    if missing:
        yield Problem(
            Condition.TOPOLOGY_NOT_DECLARED,
            "the topology is not declared",
            f"{len(missing)} of {len(status.queues)} queues missing ({_names(missing)}); "
            "consumers and scans refuse to start without it",
            f"Run {DECLARE_COMMAND} (as a RabbitMQ user that may configure)",
        )
    main = next((queue for queue in status.queues if queue.name == QUEUE), None)
    if main is not None and main.consumers == 0:
        due = status.backlog.total if status.backlog is not None else 0
        yield Problem(
            Condition.NO_CONSUMER,
            f"no consumer is attached to {QUEUE}",
            (f"{due} due hold(s) wait" if due else "due holds would wait")
            + " and nothing is expired, even if consumer processes run",
            "Start consumers (python -m service.consume); check their /readyz and logs",
        )


def _backlog_problems(status: Status, backlog: Backlog) -> Iterator[Problem]:
    if backlog.oldest_due_age_seconds > status.objective_seconds:
        yield Problem(
            Condition.OBJECTIVE_BREACHED,
            f"the oldest due hold is {human(backlog.oldest_due_age_seconds)} old, over the "
            f"objective of {human(status.objective_seconds)}",
            f"{backlog.total} due hold(s) are not expired in time",
            "If no other line says why, consumers are too few or too slow: add consumers, "
            f"and watch the ready count of {QUEUE}",
        )


def _scan_problems(status: Status) -> Iterator[Problem]:
    stall = status.scan_stall_seconds
    publish_age = status.newest_publish_age_seconds
    if publish_age is not None and publish_age <= stall:
        published = f"; the scan last published {human(publish_age)} ago"
    else:  # a long pass records its pass at its end, but its pages as it goes
        published = ""
    if not status.passes:
        if not published:
            yield _no_scan_yet(status)
        return
    newest = status.passes[0]
    if newest.age_seconds > stall and not published:
        yield Problem(
            Condition.SCANNER_STOPPED,
            f"the scanner looks stopped: no pass has ended for {human(newest.age_seconds)}",
            f"the last ({newest.result}, {newest.scanner}) is older than "
            f"EXPIRY_SCAN_INTERVAL_SECONDS allows ({human(stall)}: two intervals, the publish "
            "timeout and 5s) and nothing was published since, so due holds get no command",
            "Check that the scanner runs (python -m service.produce --every SECONDS) and read "
            "its scan.failed lines; a pass that cannot reach the broker records nothing",
        )
        return
    failing = [p for p in status.passes if p.failed and (p is newest or p.age_seconds <= stall)]
    if failing:
        yield Problem(
            Condition.SCAN_FAILING,
            "the last scan pass failed" if newest in failing else "a scan pass failed",
            "; ".join(
                f"{p.scanner}: {p.result}, {p.unconfirmed} not confirmed, "
                f"{human(p.age_seconds)} ago"
                for p in failing
            )
            + "; the holds it left are published again by the next pass",
            "Read the scanner's scan.failed lines (python -m service.produce --scan says why "
            "in one line)",
        )


def _retention_problems(status: Status) -> Iterator[Problem]:
    ahead = status.partitions_ahead_seconds
    if ahead is not None and ahead < PARTITIONS_AHEAD_MIN_SECONDS:
        reach = f"only {human(ahead)} past now" if ahead > 0 else f"{human(-ahead)} short of now"
        yield Problem(
            Condition.PARTITIONS_RUNNING_OUT,
            f"the audit tables' partitions reach {reach}",
            "an expiry stamped past the last partition cannot be written: it fails, is "
            "retried, then dead-lettered",
            f"Run {RETENTION_COMMAND} as the owner of the tables now, then restore its timer",
        )
    age = status.retention_run_age_seconds
    if age is not None and age > RETENTION_RUN_MAX_AGE_SECONDS:
        last = status.retention.last_ok if status.retention is not None else None
        yield Problem(
            Condition.RETENTION_NOT_RUN,
            f"retention has not succeeded for {human(age)}"
            + ("" if last is not None else " (never since it began)"),
            "the audit trail, leases and settled dead letters grow, and no partition is made ahead",
            f"Run {RETENTION_COMMAND} on a timer (compose's retention service), as the owner "
            "of the tables; its last line says why it fails",
        )


def _events_problems(status: Status) -> Iterator[Problem]:
    events = status.events
    if events is not None and not status.events_objective_met:
        yield Problem(
            Condition.EVENTS_BEHIND,
            f"the oldest pending event is {human(events.oldest_age_seconds)} old, over the "
            f"objective of {human(status.events_objective_seconds)}",
            f"{events.count} event(s) wait in the outbox: other services have not learnt of "
            "these expiries (nothing is lost: they are published once a relay runs)",
            f"Events are not being published: start {RELAY_COMMAND}, or check it (its "
            "relay.* log lines, RabbitMQ, the exchange expiry.events)",
        )


def _webhook_problems(status: Status) -> Iterator[Problem]:
    for endpoint in status.webhooks or []:
        if endpoint.disabled_at is not None:
            since = endpoint.disabled_at.isoformat(timespec="seconds")
            yield Problem(
                Condition.WEBHOOK_DISABLED,
                f"webhook endpoint {endpoint.endpoint} is disabled since {since}: it answered "
                "410 Gone",
                f"nothing is sent to it; its {endpoint.pending} delivery(ies) wait, and the "
                "time it is disabled does not count against their age",
                f"Once the receiver is back: python -m service.deliver --enable "
                f"{endpoint.endpoint}; if it is gone for good: --retire {endpoint.endpoint}",
            )
        if endpoint.paused_for > 0:
            yield Problem(
                Condition.WEBHOOK_PAUSED,
                f"webhook endpoint {endpoint.endpoint} is paused for {human(endpoint.paused_for)}",
                "it failed too often in a row (any answer but a 2xx, a timeout, no "
                "connection): no deliverer sends to it but one probe",
                "Check the receiver (the deliverer's webhook.* log lines say how it failed)",
            )
        if endpoint.oldest_age > status.webhook_objective_seconds:
            yield Problem(
                Condition.WEBHOOKS_BEHIND,
                f"webhook endpoint {endpoint.endpoint}: the oldest pending delivery is "
                f"{human(endpoint.oldest_age)} old, over the objective of "
                f"{human(status.webhook_objective_seconds)}",
                f"{endpoint.pending} delivery(ies) wait: nothing is lost, they go once it answers",
                f"Start {DELIVER_COMMAND} with this endpoint, or check the receiver",
            )


def _no_scan_yet(status: Status) -> Problem:
    due = status.backlog.total if status.backlog is not None else 0
    return Problem(
        Condition.NO_SCAN_YET,
        "no scan pass has been recorded yet",
        (f"{due} due hold(s) get" if due else "due holds would get")
        + " no command until a pass runs (a pass is recorded when it ends)",
        "Start the scanner: python -m service.produce --every SECONDS (or --scan from cron)",
    )


def _all_well(status: Status) -> str:
    backlog = status.backlog
    oldest = (
        f"the oldest due hold is {human(backlog.oldest_due_age_seconds)} old"
        if backlog is not None and backlog.total
        else "nothing is due"
    )
    main = next((queue for queue in status.queues if queue.name == QUEUE), None)
    consumers = f"; {main.consumers} consumer(s)" if main is not None else ""
    scan = f"; last scan pass {human(status.passes[0].age_seconds)} ago" if status.passes else ""
    return f"{oldest} (objective {human(status.objective_seconds)}){consumers}{scan}"


def _names(queues: list[str]) -> str:
    """Queue names, the delay queues counted as one."""
    delays = [name for name in queues if name.startswith(RETRY_QUEUES)]
    names = [name for name in queues if not name.startswith(RETRY_QUEUES)]
    if delays:
        names.append(f"{RETRY_QUEUES}* ({len(delays)})")
    return ", ".join(names)
