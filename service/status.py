"""``python -m service.status``: one screen for the on-call.

The age of the oldest due hold (the number to alert on), the due backlog by
deadline age, the depth and consumers of every queue, and open dead letters by
error class. Exits 3 when the oldest due hold is older than
``EXPIRY_OLDEST_DUE_OBJECTIVE_SECONDS``, so that it serves as an alert or a
health check; 1 when the database or the broker cannot be reached.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import aio_pika
import aiormq.exceptions
from aio_pika.abc import AbstractConnection

from service.adapters import postgres
from service.adapters.metrics import Backlog
from service.cli import run_command
from service.core.redaction import redact
from service.core.topology import build_topology
from service.settings import Settings

EXIT_BROKEN = 1
EXIT_OBJECTIVE_MISSED = 3


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
    queues: list[QueueState] = field(default_factory=list)
    broker_error: str | None = None

    @property
    def objective_met(self) -> bool:
        return self.backlog.oldest_due_age_seconds <= self.objective_seconds


async def read_queues(settings: Settings) -> list[QueueState]:
    """Depth and consumers of every queue of the topology (passive declares)."""
    connection = await _connect_any(settings)
    states = []
    try:
        for spec in build_topology(settings.retry_delays).queues:
            channel = await connection.channel()
            try:
                declared = (await channel.declare_queue(spec.name, passive=True)).declaration_result
                states.append(
                    QueueState(spec.name, declared.message_count, declared.consumer_count)
                )
            except aiormq.exceptions.ChannelNotFoundEntity:
                states.append(QueueState(spec.name, None, None))
            finally:
                if not channel.is_closed:
                    await channel.close()
    finally:
        await connection.close()
    return states


async def _connect_any(settings: Settings) -> AbstractConnection:
    """A plain connection to the first node of ``AMQP_URL`` that answers."""
    last: BaseException | None = None
    for url in settings.amqp_url:
        try:
            return await aio_pika.connect(url, timeout=settings.publish_timeout_seconds)
        except (OSError, aiormq.exceptions.AMQPError, TimeoutError) as exc:
            last = exc
    raise ConnectionError(f"no node of AMQP_URL answers: {describe(last)}")


def describe(exc: BaseException | None) -> str:
    """``Type: message`` of ``exc``, redacted (the broker's errors may quote a URL)."""
    if exc is None:
        return "no node given"
    text = str(exc).strip()
    return redact(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


async def read_status(settings: Settings) -> Status:
    """Read the database (required) and the broker (reported if unreachable)."""
    conn = await postgres.connect(settings, application_name="expiry-status")
    try:
        backlog = await postgres.backlog(conn)
        dead = await postgres.dead_letters_by_class(conn)
    finally:
        await conn.close()
    status = Status(
        at=datetime.now(UTC).isoformat(timespec="seconds"),
        objective_seconds=settings.oldest_due_objective_seconds,
        backlog=backlog,
        dead_letters_by_class=dead,
    )
    try:
        status.queues = await read_queues(settings)
    except (OSError, aiormq.exceptions.AMQPError, TimeoutError) as exc:
        status.broker_error = describe(exc)
    return status


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


async def _main(settings: Settings, args: argparse.Namespace) -> int:
    status = await read_status(settings)
    print(redact(json.dumps(as_json(status), indent=2) if args.json else render(status)))
    if status.broker_error:
        return EXIT_BROKEN
    return 0 if status.objective_met else EXIT_OBJECTIVE_MISSED


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m service.status",
        description=(
            "Show the oldest due hold, the backlog, queues and dead letters. Exit 3 when the "
            "oldest due hold is older than EXPIRY_OLDEST_DUE_OBJECTIVE_SECONDS, 1 on failure."
        ),
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    run_command(parser, _main)


if __name__ == "__main__":
    main()
