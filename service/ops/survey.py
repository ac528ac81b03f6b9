"""Reading a deployment's facts for ``health.assess``: the database's (the schema against
the shipped migrations, the oldest due hold and the backlog, dead letters, parked holds,
the scanners' last passes, what retention keeps, the outbox's backlog) and the broker's
(every queue's depth and consumers), both at once; a side that cannot be read is said in
the status, not raised, and the other is still read."""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime

import aiormq.exceptions
from aio_pika.abc import AbstractConnection

from service.adapters import postgres
from service.adapters.amqp.declaring import topology_for
from service.adapters.amqp.queues import QueueProbe
from service.adapters.classify import DATABASE_ERRORS, schema_missing
from service.adapters.postgres import outbox, ownership, partitions, webhook_endpoints
from service.adapters.postgres.leases import last_passes, newest_publish_age
from service.adapters.postgres.schema import schema_state
from service.core.redaction import redact
from service.core.tls_failures import TlsRefused
from service.ops.health import QueueState, Status
from service.settings import Settings

# The scanner's own rule (service/scan/every.py): healthy while a pass ended or recorded
# a page within two intervals plus the publish timeout plus this margin.
SCAN_STALL_MARGIN_SECONDS = 5.0
PASSES_READ = 5
# What reading the queues raises when the broker cannot be reached or read.
BROKER_ERRORS = (OSError, aiormq.exceptions.AMQPError, TimeoutError, TlsRefused)


def new_status(settings: Settings) -> Status:
    """A status with nothing read yet."""
    return Status(
        at=datetime.now(UTC).isoformat(timespec="seconds"),
        objective_seconds=settings.oldest_due_objective_seconds,
        events_objective_seconds=settings.events_objective_seconds,
        webhook_objective_seconds=settings.webhook_objective_seconds,
        scan_stall_seconds=2 * settings.scan_interval_seconds
        + settings.publish_timeout_seconds
        + SCAN_STALL_MARGIN_SECONDS,
    )


async def read_status(
    settings: Settings,
    database: AbstractAsyncContextManager[postgres.Connection],
    broker: AbstractAsyncContextManager[AbstractConnection] | None,
) -> Status:
    """Both sides at once, through what opens them (``broker`` None: no connection)."""
    status = new_status(settings)
    await asyncio.gather(read_database(status, database), read_broker(status, settings, broker))
    return status


async def read_database(
    status: Status, database: AbstractAsyncContextManager[postgres.Connection]
) -> None:
    """The database's facts into ``status``; what stops the reading is said, not raised."""
    try:
        async with database as conn:
            await _read_facts(status, conn)
    except (*DATABASE_ERRORS, TlsRefused) as exc:
        status.backlog = None  # whatever was read is not the whole picture
        missing = schema_missing(exc)
        if missing is not None:
            status.not_migrated = redact(missing)
        else:
            status.database_error = describe(exc)


async def _read_facts(status: Status, conn: postgres.Connection) -> None:
    schema = await schema_state(conn)
    if not schema.current:
        status.missing_migrations = list(schema.missing)
        status.not_migrated = schema.describe()
        return
    status.backlog = await postgres.backlog(conn)
    status.dead_letters_by_class = await postgres.dead_letters_by_class(conn)
    status.parked_holds = await ownership.parked_count(conn)
    status.passes = await last_passes(conn, PASSES_READ)
    status.retention = await partitions.retained(conn)
    status.retention_began = await partitions.retention_began(conn)
    status.events = await outbox.pending(conn)
    status.webhooks = await webhook_endpoints.backlog(conn)
    if not status.passes or status.passes[0].age_seconds > status.scan_stall_seconds:
        status.newest_publish_age_seconds = await newest_publish_age(conn)


async def read_broker(
    status: Status,
    settings: Settings,
    broker: AbstractAsyncContextManager[AbstractConnection] | None,
) -> None:
    """The queues into ``status``; a broker that cannot be read is said, not raised."""
    if broker is None:
        status.broker_error = "no connection to RabbitMQ"
        return
    try:
        async with broker as connection:
            status.queues = await read_queues(connection, settings)
    except BROKER_ERRORS as exc:
        status.broker_error = describe(exc)


async def read_queues(connection: AbstractConnection, settings: Settings) -> list[QueueState]:
    """Depth and consumers of every queue of the topology (passive declares)."""
    probe = QueueProbe(connection)
    states = []
    try:
        for spec in topology_for(settings).queues:
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
