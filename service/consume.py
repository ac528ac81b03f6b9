"""``python -m service.consume``: delivery -> domain -> database -> ack / retry / dead-letter.

A delivery is acked only after the guarded update committed. A failure is
classified: a transient one is republished to a delay queue (a fresh message
carrying its attempt count in ``x-expiry-attempt``), a permanent or exhausted
one to ``expirations.dead`` with the metadata an operator needs; the original
is acked only after that copy was confirmed by the broker.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

import aio_pika
import aiormq.exceptions
from aio_pika.abc import (
    AbstractChannel,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractRobustConnection,
    DeliveryMode,
)

from service import broker, db
from service.cli import run_command
from service.domain import Outcome, parse_command
from service.errors import PublishNotConfirmed, ServiceError, classify
from service.recorder import RECORDER_PREFETCH, Recorder
from service.records import (
    ATTEMPT_HEADER,
    ERROR_CLASS_HEADER,
    FIRST_SEEN_HEADER,
    GIVE_UP_HEADER,
    LAST_SEEN_HEADER,
    REASON_HEADER,
    WORKER_HEADER,
    header_int,
)
from service.retry import DeadLetter, Retry, RetryPolicy, decide
from service.settings import Settings
from service.topology import (
    DEAD_EXCHANGE,
    DEAD_LOG_QUEUE,
    DEAD_ROUTING_KEY,
    QUEUE,
    RETRY_EXCHANGE,
    build_topology,
    declare_topology,
    retry_routing_key,
)

log = logging.getLogger("service.consume")

# Pause before returning a delivery whose retry or dead-letter copy could not
# be published, so that a broker refusing publishes is not hammered.
REQUEUE_PAUSE_SECONDS = 1.0
# Test-only failpoints (EXPIRY_FAILPOINT): "exit-after-commit" exits the process
# right after the first commit, before its ack, as a crash there would;
# "exit-on:<reservation uuid>" exits whenever that reservation's command is
# handled, like a message that kills every consumer that takes it.
FAILPOINT_EXIT_AFTER_COMMIT = "exit-after-commit"
FAILPOINT_EXIT_ON = "exit-on:"


@dataclass(frozen=True)
class Attempt:
    """What a delivery says about its own history."""

    number: int
    first_seen_ms: int
    message_id: str


def read_attempt(message: AbstractIncomingMessage, now_ms: int) -> Attempt:
    """Read the attempt number and first-seen time from our headers (defaults: 1, now)."""
    headers = message.headers or {}
    return Attempt(
        number=max(1, header_int(headers, ATTEMPT_HEADER, 1)),
        first_seen_ms=min(now_ms, header_int(headers, FIRST_SEEN_HEADER, now_ms)),
        message_id=message.message_id or "-",
    )


def short_reason(exc: BaseException) -> str:
    """A reason safe to log and to store: our own messages, else only the error type."""
    if isinstance(exc, ServiceError):
        return str(exc)[:200]
    sqlstate = getattr(exc, "sqlstate", None)
    return f"{type(exc).__name__} (sqlstate {sqlstate})" if sqlstate else type(exc).__name__


def now_ms() -> int:
    """The worker's wall clock in epoch milliseconds (used only for retry budgets)."""
    return time.time_ns() // 1_000_000


class Consumer:
    """Handles deliveries of the ``expirations`` queue, each in its own task."""

    def __init__(
        self,
        settings: Settings,
        pool: db.Pool,
        retry_exchange: AbstractExchange,
        dead_exchange: AbstractExchange,
        in_flight: broker.InFlight,
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.retry_exchange = retry_exchange
        self.dead_exchange = dead_exchange
        self.policy = RetryPolicy(
            settings.retry_delays, settings.max_attempts, settings.max_age_seconds
        )
        self.in_flight = in_flight
        self._acquire_timeout = (
            settings.db_connect_timeout_seconds + settings.statement_timeout_ms / 1000
        )

    async def on_message(self, message: AbstractIncomingMessage) -> None:
        """The broker's callback: track the task so that shutdown can wait for it."""
        self.in_flight.track()
        await self.handle(message)

    async def handle(self, message: AbstractIncomingMessage) -> None:
        """Process one delivery and settle it explicitly."""
        started = time.monotonic()
        attempt = read_attempt(message, now_ms())
        reservation_id = "-"
        try:
            command = parse_command(message.body)
            reservation_id = str(command.reservation_id)
            self._failpoint(FAILPOINT_EXIT_ON + reservation_id)
            async with self.pool.acquire(timeout=self._acquire_timeout) as conn:
                outcome = await db.expire_reservation(
                    conn,
                    command.reservation_id,
                    message_id=attempt.message_id,
                    attempt=attempt.number,
                    worker=self.settings.worker_id,
                )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self.on_failure(message, attempt, reservation_id, exc, started)
            return
        self._failpoint(FAILPOINT_EXIT_AFTER_COMMIT)
        acked = await broker.settle(message.ack, attempt.message_id)
        _log_outcome(message, attempt, reservation_id, outcome, started, acked=acked)

    async def on_failure(
        self,
        message: AbstractIncomingMessage,
        attempt: Attempt,
        reservation_id: str,
        exc: Exception,
        started: float,
    ) -> None:
        """Retry through a delay queue or dead-letter; ack only once the copy is confirmed."""
        disposition, error_class = classify(exc)
        age = (now_ms() - attempt.first_seen_ms) / 1000
        decision = decide(self.policy, disposition, attempt=attempt.number, age_seconds=age)
        facts = {
            "reservation_id": reservation_id,
            "message_id": attempt.message_id,
            "attempt": attempt.number,
            "error_class": error_class,
            "reason": short_reason(exc),
            "elapsed_ms": round((time.monotonic() - started) * 1000, 1),
        }
        try:
            await self.publish_copy(message, attempt, decision, error_class, short_reason(exc))
        except PublishNotConfirmed as publish_exc:
            log.warning("expiry.copy_failed", extra={**facts, "copy_error": str(publish_exc)})
            await asyncio.sleep(REQUEUE_PAUSE_SECONDS)
            await broker.settle(lambda: message.nack(requeue=True), attempt.message_id)
            return
        if await broker.settle(message.ack, attempt.message_id):
            if isinstance(decision, Retry):
                log.info("expiry.retry", extra={**facts, "delay_s": decision.delay_seconds})
            else:
                log.warning("expiry.dead_letter", extra={**facts, "give_up": decision.why.value})

    async def publish_copy(
        self,
        message: AbstractIncomingMessage,
        attempt: Attempt,
        decision: Retry | DeadLetter,
        error_class: str,
        reason: str,
    ) -> None:
        """Publish the retry or dead-letter copy of ``message`` and wait for its confirm."""
        headers: dict[str, Any] = {
            FIRST_SEEN_HEADER: attempt.first_seen_ms,
            ERROR_CLASS_HEADER: error_class,
            REASON_HEADER: reason,
            WORKER_HEADER: self.settings.worker_id,
        }
        if isinstance(decision, Retry):
            headers[ATTEMPT_HEADER] = decision.next_attempt
            exchange, routing_key = self.retry_exchange, retry_routing_key(decision.delay_seconds)
        else:
            headers[ATTEMPT_HEADER] = attempt.number
            headers[GIVE_UP_HEADER] = decision.why.value
            headers[LAST_SEEN_HEADER] = now_ms()
            exchange, routing_key = self.dead_exchange, DEAD_ROUTING_KEY
        copy = aio_pika.Message(
            message.body,
            headers=headers,
            content_type=message.content_type,
            delivery_mode=DeliveryMode.PERSISTENT,
            message_id=message.message_id,
            timestamp=message.timestamp,
            type=message.type,
            app_id=message.app_id,
        )
        await broker.publish_confirmed(
            exchange, copy, routing_key, timeout=self.settings.publish_timeout_seconds
        )

    def _failpoint(self, name: str) -> None:
        if self.settings.failpoint and self.settings.failpoint.lower() == name:
            log.warning("expiry.failpoint", extra={"failpoint": self.settings.failpoint})
            logging.shutdown()
            os._exit(137)


def _log_outcome(
    message: AbstractIncomingMessage,
    attempt: Attempt,
    reservation_id: str,
    outcome: Outcome,
    started: float,
    *,
    acked: bool,
) -> None:
    log.info(
        "expiry.outcome",
        extra={
            "reservation_id": reservation_id,
            "message_id": attempt.message_id,
            "attempt": attempt.number,
            "outcome": outcome.value,
            "redelivered": bool(message.redelivered),
            "acked": acked,
            "elapsed_ms": round((time.monotonic() - started) * 1000, 1),
        },
    )


async def run(settings: Settings, stop: asyncio.Event) -> None:
    """Consume until ``stop`` is set, then drain what is in flight and close."""
    pool = await db.create_pool(
        settings, application_name="expiry-consume", size=settings.db_pool_size
    )
    try:
        connection = await broker.connect(settings, name=f"expiry-consume {settings.worker_id}")
        try:
            await _consume(settings, pool, connection, stop)
        finally:
            await connection.close()
    finally:
        await pool.close()


async def _consume(
    settings: Settings, pool: db.Pool, connection: AbstractRobustConnection, stop: asyncio.Event
) -> None:
    consume_channel: AbstractChannel = await connection.channel(publisher_confirms=False)
    await consume_channel.set_qos(prefetch_count=settings.prefetch)
    declared = await declare_topology(consume_channel, build_topology(settings.retry_delays))
    publish_channel = await broker.open_confirm_channel(connection)
    record_channel = await connection.channel(publisher_confirms=False)
    await record_channel.set_qos(prefetch_count=RECORDER_PREFETCH)
    in_flight = broker.InFlight()
    consumer = Consumer(
        settings,
        pool,
        retry_exchange=await publish_channel.get_exchange(RETRY_EXCHANGE, ensure=False),
        dead_exchange=await publish_channel.get_exchange(DEAD_EXCHANGE, ensure=False),
        in_flight=in_flight,
    )
    recorder = Recorder(pool, in_flight)
    work = declared.queues[QUEUE]
    dead_log = await record_channel.get_queue(DEAD_LOG_QUEUE, ensure=False)
    consumers = [
        (work, await work.consume(consumer.on_message)),
        (dead_log, await dead_log.consume(recorder.on_message)),
    ]
    log.info("consumer.started", extra={"queue": QUEUE, "prefetch": settings.prefetch})
    await stop.wait()
    log.info("consumer.draining", extra={"in_flight": len(in_flight.tasks)})
    for queue, tag in consumers:
        try:
            await queue.cancel(tag)
        except (aiormq.exceptions.AMQPError, aiormq.exceptions.ChannelInvalidStateError, OSError):
            log.warning("consumer.cancel_failed", extra={"queue": queue.name})
    abandoned = await in_flight.drain(settings.shutdown_timeout_seconds)
    if abandoned:
        log.warning("consumer.drain_timeout", extra={"returned": abandoned})
    log.info("consumer.drained")
    for channel in (publish_channel, record_channel, consume_channel):
        await channel.close()


async def _main(settings: Settings, _args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await run(settings, stop)
    log.info("consumer.stopped")
    return 0


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m service.consume",
        description=(
            "Consume expiration commands until SIGTERM or SIGINT, then finish what is in "
            "flight and exit 0."
        ),
    )
    run_command(parser, _main)


if __name__ == "__main__":
    main()
