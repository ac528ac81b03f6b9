"""The consumer's runtime, assembled from the real parts (tests assemble fakes)."""

from __future__ import annotations

from dataclasses import dataclass

from aio_pika.abc import AbstractChannel

from service.adapters import postgres
from service.adapters.telemetry import consumer_tracing
from service.adapters.telemetry.metrics import Metrics
from service.core.topology import DEAD_EXCHANGE, RETRY_EXCHANGE
from service.settings import Settings
from service.worker.acks import AckAlone, Acker, Acks
from service.worker.batcher import Batcher
from service.worker.consumer import Consumer
from service.worker.failpoints import failpoints_for
from service.worker.failures import Failures
from service.worker.inflight import InFlight
from service.worker.ports import AmqpPublisher, PostgresStore
from service.worker.quarantine import Quarantine
from service.worker.recorder import Recorder
from service.worker.reporting import Reporter
from service.worker.wakeup import Wakeup, wakeup_for

# Batches run in parallel on this many connections (the rest of the pool is
# left for deliveries that fall back to their own transaction, and suspects).
BATCH_WORKERS = 2


@dataclass(frozen=True)
class Runtime:
    """What consumes the work queue and the dead-letter log."""

    consumer: Consumer
    recorder: Recorder
    batcher: Batcher
    in_flight: InFlight
    reporter: Reporter
    wakeup: Wakeup  # the relays', after commits that wrote events


async def assemble(
    settings: Settings, pool: postgres.Pool, publish_channel: AbstractChannel, metrics: Metrics
) -> Runtime:
    """The consumer and the recorder on this pool, publishing on this confirm channel."""
    batched = settings.batch_size > 1
    spare = max(1, settings.db_pool_size - 1)
    batch_workers = min(BATCH_WORKERS, spare) if batched else spare
    wakeup = wakeup_for(
        pool,
        window_ms=settings.events_notify_ms,
        timeout=settings.db_connect_timeout_seconds + settings.statement_timeout_ms / 1000,
    )
    store = PostgresStore(
        pool, settings, for_batches=batch_workers if batched else 0, wakeup=wakeup
    )
    dead_exchange = await publish_channel.get_exchange(DEAD_EXCHANGE, ensure=False)
    publisher = AmqpPublisher(
        await publish_channel.get_exchange(RETRY_EXCHANGE, ensure=False),
        dead_exchange,
        settings.publish_timeout_seconds,
    )
    acks: Acks = Acker() if batched else AckAlone()
    batcher = Batcher(
        store, size=settings.batch_size, wait_ms=settings.batch_wait_ms, workers=batch_workers
    )
    reporter = Reporter(metrics)
    failpoints = failpoints_for(settings.failpoint)
    in_flight = InFlight()
    consumer = Consumer(
        batcher=batcher,
        store=store,
        quarantine=Quarantine(store, failpoints),
        failures=Failures(settings, publisher, acks, reporter),
        acks=acks,
        reporter=reporter,
        failpoints=failpoints,
        in_flight=in_flight,
        tracing=consumer_tracing(settings),
    )
    recorder = Recorder(
        pool,
        in_flight,
        dead_exchange,
        settings=settings,
        metrics=metrics,
    )
    return Runtime(consumer, recorder, batcher, in_flight, reporter, wakeup)
