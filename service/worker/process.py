"""The consumer process: its channels, the runtime on them, the health endpoint and the
backlog gauges, from start to a drained stop.

``python -m service.consume`` runs ``run`` until SIGTERM or SIGINT; the tests run it in
process. What one delivery does is in ``consumer.py`` and the units it routes to.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from functools import partial

from aio_pika.abc import AbstractRobustConnection

from service.adapters import amqp, postgres
from service.adapters.amqp.consuming import QueueConsumer
from service.adapters.amqp.declaring import check_topology
from service.adapters.http.server import HealthServer
from service.adapters.telemetry.gauges import configure, refresh_gauges
from service.adapters.telemetry.metrics import Metrics
from service.core.topology import DEAD_LOG_QUEUE, QUEUE
from service.settings import Settings
from service.worker.recorder import RECORDER_PREFETCH
from service.worker.reporting import SUMMARY_SECONDS, Reporter
from service.worker.runtime import assemble

log = logging.getLogger("service.consume")

BACKLOG_REFRESH_SECONDS = 15.0
READINESS_TIMEOUT_SECONDS = 2.0


async def run(
    settings: Settings,
    stop: asyncio.Event,
    *,
    metrics: Metrics | None = None,
    backlog_every: float | None = None,
) -> None:
    """Consume until ``stop`` is set, then drain what is in flight and close.

    ``backlog_every`` (seconds) refreshes the gauges from the database.
    """
    async with contextlib.AsyncExitStack() as opened:
        pool = await opened.enter_async_context(
            postgres.pooled(settings, name="expiry-consume", size=settings.db_pool_size)
        )
        connection = await opened.enter_async_context(
            amqp.connected(settings, name=f"expiry-consume {settings.worker_id}")
        )
        metrics = metrics or Metrics()
        configure(metrics.gauges, settings)
        await _consume(settings, pool, connection, stop, metrics, backlog_every)


async def _consume(
    settings: Settings,
    pool: postgres.Pool,
    connection: AbstractRobustConnection,
    stop: asyncio.Event,
    metrics: Metrics,
    backlog_every: float | None,
) -> None:
    # The consumer declares nothing (it may not configure): it checks the topology, then
    # consumes the work queue (QueueConsumer consumes again after a reconnect) and takes
    # the dead-letter log with a passive declare, which a reconnect repeats.
    await check_topology(connection, settings)
    consume_channel = await connection.channel(publisher_confirms=False)
    await consume_channel.set_qos(prefetch_count=settings.prefetch)
    publish_channel = await amqp.open_confirm_channel(connection)
    record_channel = await connection.channel(publisher_confirms=False)
    await record_channel.set_qos(prefetch_count=RECORDER_PREFETCH)
    runtime = await assemble(settings, pool, publish_channel, metrics)
    in_flight = runtime.in_flight
    # The dead-letter log on aio-pika's robust queue, then the work queue on aiormq (its
    # hot path: see consuming.py), last: once the broker lists a consumer of the work
    # queue, the consumer has started.
    dead_log = await record_channel.declare_queue(DEAD_LOG_QUEUE, passive=True)
    dead_log_tag = await dead_log.consume(runtime.recorder.on_message)
    work = QueueConsumer(consume_channel, QUEUE, runtime.consumer.on_message)
    await work.start()
    log.info("consumer.started", extra={"queue": QUEUE, "prefetch": settings.prefetch})
    reporter = runtime.reporter
    async with _sidecars(settings, pool, work, stop, metrics, backlog_every, reporter):
        await stop.wait()
        log.info("consumer.draining", extra={"in_flight": len(in_flight)})
        stopping = ((QUEUE, work.cancel), (DEAD_LOG_QUEUE, partial(dead_log.cancel, dead_log_tag)))
        for name, cancel in stopping:
            try:
                await cancel()
            except amqp.CHANNEL_ERRORS:
                log.warning("consumer.cancel_failed", extra={"queue": name})
        abandoned = await in_flight.drain(settings.shutdown_timeout_seconds)
    if abandoned:
        log.warning("consumer.drain_timeout", extra={"returned": abandoned})
    log.info("consumer.drained")
    await runtime.batcher.close()
    await runtime.wakeup.close()  # the last commits' wake-up, while the pool is open
    metrics.flush()  # the counts of the last turn, for a last scrape or push
    runtime.reporter.summarize()  # what the last interval did
    for channel in (publish_channel, record_channel, consume_channel):
        await channel.close()


async def _summarize_every(reporter: Reporter, seconds: float) -> None:
    """An ``expiry.summary`` line every ``seconds`` in which something happened."""
    while True:
        await asyncio.sleep(seconds)
        reporter.summarize()


@contextlib.asynccontextmanager
async def _sidecars(
    settings: Settings,
    pool: postgres.Pool,
    work: QueueConsumer,
    stop: asyncio.Event,
    metrics: Metrics,
    backlog_every: float | None,
    reporter: Reporter,
) -> AsyncIterator[None]:
    """The health endpoint, the gauges' refresher and the periodic summary line, for as
    long as the consumer runs."""
    server: HealthServer | None = None
    if settings.http_port:

        async def readiness() -> dict[str, bool]:
            return {
                "consuming": not stop.is_set(),
                "channel": work.consuming,
                "database": await postgres.answers(pool, READINESS_TIMEOUT_SECONDS),
            }

        server = HealthServer(readiness, metrics=backlog_every is not None)
        await server.start(settings.http_host, settings.http_port)
    tasks = [asyncio.create_task(_summarize_every(reporter, SUMMARY_SECONDS))]
    if backlog_every is not None:
        tasks.append(
            asyncio.create_task(
                refresh_gauges(pool, metrics.gauges, backlog_every, dead_letters=True, outbox=True)
            )
        )
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if server is not None:
            await server.close()
