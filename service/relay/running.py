"""The relay process, from its start to a clean stop.

At its start it checks that every migration it ships is applied (exit 5 otherwise) and
that the events exchange exists on the broker as ``declare`` declares it (it may not
configure: exit 1 with one line otherwise); then it opens a confirm channel on a robust
connection (which reconnects by itself, to the other nodes of ``AMQP_URL`` too), a small
pool for its claims and marks, and its listener (``listener.py``), and drains the outbox
(``pump.py``) until SIGTERM or SIGINT: the batch in hand is finished (published and
marked), then it closes everything and ``python -m service.relay`` exits 0.

Its endpoint (``EXPIRY_HTTP_PORT``) serves ``/healthz`` (the event loop answers),
``/readyz`` (its last look into the outbox succeeded, recently; the broker connection
and its channel are open; the database answers; it listens) and ``/metrics``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from service.adapters import amqp, postgres
from service.adapters.amqp.declaring import check_topology
from service.adapters.amqp.page_publisher import PagePublisher
from service.adapters.http.server import serving
from service.adapters.postgres.schema import require_current_schema
from service.adapters.telemetry import recorder_for
from service.adapters.telemetry.relay_metrics import RelayMetrics
from service.core.errors import UsageError
from service.core.events import EVENT
from service.core.topology import EVENT_ROUTING_KEY, EVENTS_EXCHANGE, events_topology
from service.relay.exit_points import exits_for
from service.relay.listener import listening, polling_only
from service.relay.pump import Pump
from service.settings import Settings

log = logging.getLogger("service.relay")

# Claims and marks take turns on one connection; the other answers /readyz.
POOL_SIZE = 2
READINESS_TIMEOUT_SECONDS = 2.0


def check_settings(settings: Settings) -> None:
    """Refuse, in one line naming the setting, a claim that a publish outlives: its events
    would be claimed and published again by another relay while this one still waits for
    their confirms."""
    lease, publish = settings.relay_lease_seconds, settings.publish_timeout_seconds
    if lease <= publish:
        raise UsageError(
            f"EXPIRY_RELAY_LEASE_SECONDS ({lease:g}) must exceed EXPIRY_PUBLISH_TIMEOUT_SECONDS "
            f"({publish:g}), and by the mark's round trip: a batch's claim must outlive its "
            "publish"
        )


async def run(
    settings: Settings, stop: asyncio.Event, *, metrics: RelayMetrics | None = None
) -> Pump:
    """Relay events until ``stop`` is set; finish the batch in hand, close, and return the
    pump (what it did: ``pump.ledger``)."""
    check_settings(settings)
    metrics = metrics or RelayMetrics()
    async with contextlib.AsyncExitStack() as opened:
        pool = await opened.enter_async_context(
            # A claim or a mark that a crash of PostgreSQL loses is harmless (the event
            # is claimed and published again, with its id), so their commits do not wait
            # for the disk: each batch waits on two commits (docs/benchmark.md, "Events").
            # The events themselves are written by the expiries, flushed.
            postgres.pooled(settings, name="expiry-relay", size=POOL_SIZE, flushed=False)
        )
        async with pool.acquire() as conn:
            await require_current_schema(conn)
        connection = await opened.enter_async_context(
            amqp.connected(settings, name=f"expiry-relay {settings.worker_id}")
        )
        await check_topology(connection, settings, events_topology())
        channel = await amqp.open_confirm_channel(connection)
        publisher = PagePublisher(
            channel,
            EVENTS_EXCHANGE,
            EVENT_ROUTING_KEY,
            recorder_for("service.relay"),
            message_type=EVENT,
            continued_only=True,
            mandatory=settings.events_unroutable == "keep",
        )
        pump = Pump(settings, pool, publisher, metrics, exits_for(settings.failpoint))
        wake = asyncio.Event()
        listener = await opened.enter_async_context(listening(settings, wake))
        metrics.is_listening = lambda: listener.listening

        polls_only = polling_only(settings)

        async def readiness() -> dict[str, bool]:
            ready = {
                "draining": pump.health.draining(),
                "broker": connection.connected.is_set() and not channel.is_closed,
                "database": await postgres.answers(pool, READINESS_TIMEOUT_SECONDS),
            }
            if not polls_only:  # a relay that cannot listen is ready all the same
                ready["listening"] = listener.listening
            return ready

        async with serving(settings.http_host, settings.http_port, readiness):
            log.info(
                "relay.started",
                extra={"exchange": EVENTS_EXCHANGE, "batch_size": settings.relay_batch_size},
            )
            await pump.run(stop, wake)
        await channel.close()
    log.info("relay.stopped", extra=pump.ledger.facts())
    return pump
