"""``python -m service.produce --scan``: publish a command for every due hold.

One bounded pass, oldest deadline first, in keyset pages. Each page is locked
(``FOR NO KEY UPDATE SKIP LOCKED``, so that overlapping scans split the work)
and claimed with a short lease in one short transaction; then published with
confirms, one window for the page; then the lease of each confirmed command is
extended, and the claims of the others lapse at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import time
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import aio_pika
from aio_pika.abc import AbstractExchange, DeliveryMode

from service import broker, db, telemetry
from service.cli import positive_seconds, run_command
from service.domain import command_body, message_id
from service.errors import PublishNotConfirmed
from service.settings import Settings
from service.topology import EXCHANGE, ROUTING_KEY, build_topology, declare_topology

log = logging.getLogger("service.produce")

APP_ID = "expiry-service"
# A claim outlives the wait for confirms by this much; if the scan dies while
# publishing, its claims lapse and the next scan publishes those holds again.
CLAIM_MARGIN_SECONDS = 5.0


@dataclass
class ScanResult:
    """What one scan did."""

    published: int = 0
    failed: int = 0
    batches: int = 0


def build_command(hold: db.DueHold) -> aio_pika.Message:
    """The persistent expiration command for one due hold."""
    return aio_pika.Message(
        command_body(hold.id, hold.hold_until),
        content_type="application/json",
        delivery_mode=DeliveryMode.PERSISTENT,
        message_id=message_id(hold.id, hold.hold_until),
        type="expire",
        app_id=APP_ID,
    )


async def scan(settings: Settings) -> ScanResult:
    """Run one scan; raise ``PublishNotConfirmed`` if any publish was not confirmed."""
    # The broker first: if it is down, nothing is claimed and nothing recorded.
    connection = await broker.connect(settings, name=f"expiry-produce {settings.worker_id}")
    try:
        channel = await broker.open_confirm_channel(connection)
        declared = await declare_topology(channel, build_topology(settings.retry_delays))
        exchange = declared.exchanges[EXCHANGE]
        conn = await db.connect(settings, application_name="expiry-produce")
        try:
            result = await scan_pass(conn, exchange, settings)
        finally:
            await conn.close()
    finally:
        await connection.close()
    if result.failed:
        raise PublishNotConfirmed(
            f"{result.failed} command(s) not confirmed by the broker "
            f"({result.published} confirmed); the next scan publishes them again"
        )
    return result


async def scan_pass(
    conn: db.Connection, exchange: AbstractExchange, settings: Settings
) -> ScanResult:
    """Publish every due hold without a live lease, as of the scan's start.

    Pipelined two pages deep: while one page's confirms come in, the next page
    is claimed and published, and the page before is recorded; so neither the
    broker nor the database waits for the other, and at most two pages are in
    memory whatever the backlog.
    """
    result = ScanResult()
    until = await db.db_now(conn)
    cursor = (db.EPOCH_START, db.NIL_UUID)
    previous: Publishing | None = None
    try:
        while True:
            page, batch = await claim_page(conn, settings, until=until, after=cursor)
            pending = previous
            previous = Publishing(batch, settings.publish_timeout_seconds, exchange)
            if pending is not None:
                await record_page(conn, settings, pending, result)
            if not page or len(page) < settings.scan_batch_size or result.failed:
                break
            cursor = (page[-1].hold_until, page[-1].id)
    finally:
        if previous is not None:
            await record_page(conn, settings, previous, result)
    return result


class Publishing:
    """One page's commands on their way: published at once, confirms awaited later."""

    def __init__(self, batch: list[db.DueHold], timeout: float, exchange: AbstractExchange) -> None:
        self.batch = batch
        self.task = asyncio.ensure_future(publish_batch(exchange, batch, timeout))


async def record_page(
    conn: db.Connection, settings: Settings, page: Publishing, result: ScanResult
) -> None:
    """Wait for a page's confirms; extend the leases of the confirmed, lapse the others."""
    try:
        confirmed = await page.task
    except BaseException:
        page.task.cancel()
        raise
    done = {hold.id for hold in confirmed}
    failed = [hold.id for hold in page.batch if hold.id not in done]
    async with conn.transaction():
        await db.record_leases(
            conn, [hold.id for hold in confirmed], lease_seconds=settings.lease_seconds
        )
        await db.release_claims(conn, failed)
    if page.batch:
        result.batches += 1
    result.published += len(confirmed)
    result.failed += len(failed)


async def claim_page(
    conn: db.Connection, settings: Settings, *, until: datetime, after: tuple[datetime, UUID]
) -> tuple[list[db.DueHold], list[db.DueHold]]:
    """Lock the next page, claim it with a short lease, commit: locks last milliseconds.

    Returns the page (for the cursor) and the holds this scan claimed in it.
    """
    async with conn.transaction():
        page = await db.claim_due(conn, until=until, after=after, limit=settings.scan_batch_size)
        claimed = await db.claim_leases(
            conn,
            [hold.id for hold in page],
            [message_id(hold.id, hold.hold_until) for hold in page],
            claim_seconds=settings.publish_timeout_seconds + CLAIM_MARGIN_SECONDS,
        )
    return page, [hold for hold in page if hold.id in claimed]


async def publish_batch(
    exchange: AbstractExchange, batch: list[db.DueHold], timeout: float
) -> list[db.DueHold]:
    """Publish a page concurrently, one window of confirms with one deadline for the
    whole window; return the holds whose commands the broker confirmed."""
    if not batch:
        return []
    tasks = [
        asyncio.ensure_future(
            broker.publish_confirmed(exchange, build_command(hold), ROUTING_KEY, timeout=None)
        )
        for hold in batch
    ]
    _done, late = await asyncio.wait(tasks, timeout=timeout)
    for task in late:
        task.cancel()
    await asyncio.gather(*late, return_exceptions=True)
    confirmed: list[db.DueHold] = []
    for hold, task in zip(batch, tasks, strict=True):
        error = None if task.cancelled() else task.exception()
        if task.cancelled() or isinstance(error, PublishNotConfirmed):
            reason = f"no confirm within {timeout:g}s" if task.cancelled() else str(error)
            log.warning(
                "expiry.publish_failed", extra={"reservation_id": str(hold.id), "reason": reason}
            )
        elif error is not None:
            raise error
        else:
            confirmed.append(hold)
    return confirmed


async def _scan_and_report(settings: Settings) -> None:
    started = time.monotonic()
    result = await scan(settings)
    elapsed = time.monotonic() - started
    print(
        f"scan: published {result.published} command(s) in {result.batches} batch(es), "
        f"all confirmed, {elapsed:.2f}s",
        flush=True,
    )


async def scan_every(settings: Settings, interval: float, stop: asyncio.Event) -> None:
    """Start a scan every ``interval`` seconds (start to start) until ``stop``.

    A pass that takes longer than ``interval`` is followed by the next at once
    (no burst to catch up); a failed scan is logged, not fatal.
    """
    loop = asyncio.get_running_loop()
    next_start = loop.time()
    while not stop.is_set():
        next_start += interval
        try:
            await _scan_and_report(settings)
        except Exception:
            log.exception("scan.failed")
        now = loop.time()
        if next_start < now:
            next_start = now
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(next_start - now):
                await stop.wait()


async def _main(settings: Settings, args: argparse.Namespace) -> int:
    tracing = telemetry.setup_tracing(settings, "produce")
    try:
        if args.every is None:
            await _scan_and_report(settings)
            return 0
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await scan_every(settings, args.every, stop)
        return 0
    finally:
        telemetry.shutdown(tracing)


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m service.produce",
        description=(
            "Publish an expiration command, with publisher confirms, for every due held "
            "reservation that has no live publish lease. Exit 0 only if all were confirmed."
        ),
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--scan", action="store_true", help="run one scan and exit")
    mode.add_argument(
        "--every",
        type=positive_seconds,
        metavar="SECONDS",
        help=(
            "start a scan every SECONDS (start to start) until SIGTERM or SIGINT; "
            "a failed scan is logged, then retried"
        ),
    )
    run_command(parser, _main)


if __name__ == "__main__":
    main()
