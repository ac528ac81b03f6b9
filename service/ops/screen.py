"""The status as people and machines read it: the text screen, the JSON, and the rows
the console's overview shows too (the delay queues as one, the passes marked stale or
failed, why ``expirations.dead`` and the open dead letters differ). What the state is,
``service/ops/health.py`` decides; this only shows it. Ages for people go through
``human``; the JSON keeps seconds as numbers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from service.adapters.postgres.leases import ScanPass
from service.core.durations import human
from service.core.topology import DEAD_QUEUE
from service.ops.conditions import RETRY_QUEUES, Problem
from service.ops.health import QueueState, Status


@dataclass(frozen=True)
class QueueRow:
    """A line of the queue table: one queue, or every delay queue summed."""

    label: str
    ready: int | None  # None: missing (every queue of the row)
    consumers: int | None
    missing: int = 0


def queue_rows(queues: list[QueueState]) -> list[QueueRow]:
    """The queues as a person reads them: the delay queues (several per retry tier) as one
    row, where the first of them stood."""
    delays = [queue for queue in queues if queue.name.startswith(RETRY_QUEUES)]
    rows: list[QueueRow] = []
    for queue in queues:
        if not queue.name.startswith(RETRY_QUEUES):
            rows.append(QueueRow(queue.name, queue.ready, queue.consumers))
        elif queue is delays[0]:
            rows.append(_delay_row(delays))
    return rows


def _delay_row(delays: list[QueueState]) -> QueueRow:
    found = [queue for queue in delays if queue.ready is not None]
    missing = len(delays) - len(found)
    label = f"{RETRY_QUEUES}* ({len(delays)} delay queues)"
    if not found:
        return QueueRow(label, None, None, missing)
    ready = sum(queue.ready or 0 for queue in found)
    return QueueRow(label, ready, sum(queue.consumers or 0 for queue in found), missing)


@dataclass(frozen=True)
class PassRow:
    """A scanner's last pass as a screen shows it."""

    scanner: str
    ended: str  # how long ago, for a person
    result: str
    published: int
    unconfirmed: int
    stale: bool  # older than a running scanner's passes can be
    failed: bool


def pass_rows(status: Status) -> list[PassRow]:
    """The last passes, the newest first, each marked stale or failed."""
    return [
        PassRow(
            p.scanner,
            f"{human(p.age_seconds)} ago",
            p.result,
            p.published,
            p.unconfirmed,
            p.age_seconds > status.scan_stall_seconds,
            p.failed,
        )
        for p in status.passes
    ]


def dead_letter_note(status: Status) -> str | None:
    """Why the depth of expirations.dead and the open dead letters differ (None: they
    agree, or one of them is unknown)."""
    depth = next((q.ready for q in status.queues if q.name == DEAD_QUEUE), None)
    records = status.open_dead_letters
    if depth is None or records is None or depth == records:
        return None
    if depth > records:
        return (
            f"{DEAD_QUEUE} holds {depth - records} message(s) more than the {records} open "
            "dead letter(s): copies not yet recorded (consumers record them from "
            f"{DEAD_QUEUE}.log), or copies of closed or replayed dead letters; python -m "
            "service.deadletters tidy removes copies of closed or replayed dead letters"
        )
    return (
        f"{records - depth} open dead letter(s) have no copy in {DEAD_QUEUE} (taken or "
        "purged): a replay rebuilds the command from the record"
    )


def render(status: Status) -> str:
    """The human screen: the verdict first, a line per problem, then the figures."""
    lines = [status.verdict, *(f"- {problem.line}" for problem in status.problems), ""]
    lines.append(
        f"as of {status.at}   objective: oldest due hold <= {human(status.objective_seconds)}"
    )
    lines += _database_lines(status)
    lines += ["", f"{'queue':40} {'ready':>8} {'consumers':>10}"]
    if status.broker_error is not None:
        lines.append("  not read: RabbitMQ cannot be reached")
    lines += [_queue_line(row, status) for row in queue_rows(status.queues)]
    if (note := dead_letter_note(status)) is not None:
        lines.append(f"  note: {note}")
    if status.backlog is not None:
        lines += ["", "scan passes, the newest first:"]
        lines += [_pass_line(row) for row in pass_rows(status)] or ["  none recorded yet"]
        lines += ["", "open dead letters by error class:"]
        by_class = status.dead_letters_by_class.items()
        lines += [f"  {name:26} {count:>6}" for name, count in by_class] or ["  none"]
        lines += ["", *retention_lines(status)]
    return "\n".join(lines)


def retention_lines(status: Status) -> list[str]:
    """What is kept: the last retention run, and each table's size and retained range."""
    kept = status.retention
    if kept is None:
        return ["retention: not read"]
    age = status.retention_run_age_seconds
    last = (
        f"last run {human(age)} ago"
        if kept.last_ok is not None and age is not None
        else "never run"
    )
    lines = [f"retention ({last}); tables, their size and the range kept:"]
    for table in kept.tables:
        span = (
            f"{_day(table.since)} .. {_day(table.until)}"
            if table.since is not None and table.until is not None
            else ""
        )
        lines.append(f"  {table.name:26} {_size(table.bytes):>9}   {span}".rstrip())
    return lines


def _day(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d")


def _size(count: int) -> str:
    size, unit = float(count), "B"
    for bigger in ("kB", "MB", "GB", "TB"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"


def _database_lines(status: Status) -> list[str]:
    backlog = status.backlog
    if backlog is None:
        why = "not migrated" if status.not_migrated is not None else "cannot be reached"
        return [f"database figures not read: PostgreSQL {why}"]
    judged = "within the objective" if status.objective_met else "OVER the objective"
    buckets = ", ".join(f"{bucket}: {count}" for bucket, count in backlog.by_bucket.items())
    return [
        "",
        f"oldest due hold   {human(backlog.oldest_due_age_seconds):>9}    {judged}",
        f"due backlog       {backlog.total:>9}    {buckets}",
        f"parked holds      {status.parked_holds:>9}    (dead letters closed: not scanned)",
        *events_lines(status),
        *webhook_lines(status),
    ]


def events_lines(status: Status) -> list[str]:
    """The outbox's backlog: events written by expiries and not yet published."""
    events = status.events
    if events is None:
        return []
    objective = human(status.events_objective_seconds)
    judged = "within" if status.events_objective_met else "OVER"
    oldest = f"the oldest {human(events.oldest_age_seconds)} old, " if events.count else ""
    return [f"pending events    {events.count:>9}    {oldest}{judged} the objective ({objective})"]


def webhook_lines(status: Status) -> list[str]:
    """Each webhook endpoint's deliveries: pending (the oldest's age), dead, paused."""
    lines = []
    for endpoint in status.webhooks or []:
        oldest = f", the oldest {human(endpoint.oldest_age)} old" if endpoint.pending else ""
        paused = f", PAUSED {human(endpoint.paused_for)}" if endpoint.paused_for > 0 else ""
        if endpoint.disabled_at is not None:
            paused = f", DISABLED (410 Gone) since {endpoint.disabled_at:%Y-%m-%d %H:%M:%S%z}"
        lines.append(
            f"webhook {endpoint.endpoint:20} {endpoint.pending:>9} pending{oldest}, "
            f"{endpoint.dead} dead{paused}"
        )
    return lines


def _queue_line(row: QueueRow, status: Status) -> str:
    ready = "missing" if row.ready is None else str(row.ready)
    consumers = "-" if row.consumers is None else str(row.consumers)
    line = f"{row.label:40} {ready:>8} {consumers:>10}"
    if row.missing and row.ready is not None:
        line += f"   ({row.missing} missing)"
    if row.label == DEAD_QUEUE and status.open_dead_letters is not None:
        line += f"   open dead letters: {status.open_dead_letters}"
    return line


def _pass_line(row: PassRow) -> str:
    marks = [mark for mark, on in (("STALE", row.stale), ("FAILED", row.failed)) if on]
    flagged = f"   {' '.join(marks)}" if marks else ""
    return (
        f"  {row.scanner:30} ended {row.ended:>14}   {row.result:11} "
        f"published {row.published}, not confirmed {row.unconfirmed}{flagged}"
    )


def as_json(status: Status) -> dict[str, Any]:
    """The machine form: the same verdict and problems as data, seconds as numbers, and
    every queue."""
    backlog = status.backlog
    return {
        "verdict": status.verdict,
        "exit_code": status.exit_code,
        "problems": [
            {"condition": p.condition.value, "exit_code": p.exit_code, **_texts(p)}
            for p in status.problems
        ],
        "at": status.at,
        "objective_seconds": status.objective_seconds,
        "objective_met": status.objective_met,
        "scan_stall_seconds": status.scan_stall_seconds,
        "backlog": None if backlog is None else {**asdict(backlog), "total": backlog.total},
        "parked_holds": None if backlog is None else status.parked_holds,
        "dead_letters_by_class": None if backlog is None else status.dead_letters_by_class,
        "open_dead_letters": status.open_dead_letters,
        "dead_letter_note": dead_letter_note(status),
        "scan_passes": [_pass_json(p, status) for p in status.passes],
        "newest_publish_age_seconds": status.newest_publish_age_seconds,
        "database_error": status.database_error,
        "not_migrated": status.not_migrated,
        "missing_migrations": status.missing_migrations,
        "queues": [asdict(queue) for queue in status.queues],
        "broker_error": status.broker_error,
        "retention": _retention_json(status),
        "events": _events_json(status),
        "webhooks": None
        if status.webhooks is None
        else [
            {
                **asdict(endpoint),
                "disabled_at": endpoint.disabled_at and endpoint.disabled_at.isoformat(),
                "objective_seconds": status.webhook_objective_seconds,
            }
            for endpoint in status.webhooks
        ],
    }


def _events_json(status: Status) -> dict[str, Any] | None:
    events = status.events
    if events is None:
        return None
    return {
        "pending": events.count,
        "oldest_pending_age_seconds": events.oldest_age_seconds,
        "objective_seconds": status.events_objective_seconds,
        "objective_met": status.events_objective_met,
    }


def _retention_json(status: Status) -> dict[str, Any] | None:
    kept = status.retention
    if kept is None:
        return None
    return {
        "last_success": kept.last_ok.isoformat() if kept.last_ok is not None else None,
        "run_age_seconds": status.retention_run_age_seconds,
        "partitions_ahead_seconds": status.partitions_ahead_seconds,
        "tables": [
            {
                "name": t.name,
                "bytes": t.bytes,
                "since": t.since.isoformat() if t.since is not None else None,
                "until": t.until.isoformat() if t.until is not None else None,
            }
            for t in kept.tables
        ],
    }


def _texts(problem: Problem) -> dict[str, str]:
    return {"summary": problem.summary, "meaning": problem.meaning, "todo": problem.todo}


def _pass_json(scan: ScanPass, status: Status) -> dict[str, Any]:
    data: dict[str, Any] = asdict(scan)
    for key in ("started_at", "finished_at"):
        data[key] = data[key].isoformat() if data[key] is not None else None
    data["stale"] = scan.age_seconds > status.scan_stall_seconds
    data["failed"] = scan.failed
    return data
