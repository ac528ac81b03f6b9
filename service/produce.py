"""``python -m service.produce --scan``: publish a command for every due hold.

One bounded pass, oldest deadline first, in keyset pages. Each page is locked
(``FOR NO KEY UPDATE SKIP LOCKED``, so that overlapping scans split the work)
and claimed with a short lease in one short transaction; then published with
confirms, one window for the page; then the lease of each confirmed command is
extended, and the claims of the others lapse at once.

SIGTERM or SIGINT stops a pass between pages: nothing more is claimed or
published, the confirms in flight are awaited and recorded as usual.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

import aio_pika
from aio_pika.abc import AbstractExchange, AbstractRobustConnection, DeliveryMode

from service import broker, db, telemetry
from service.cli import positive_seconds, run_command
from service.declare import check_topology
from service.domain import command_body, message_id
from service.errors import PublishNotConfirmed, ServiceError, TopologyMismatch
from service.settings import Settings
from service.topology import EXCHANGE, ROUTING_KEY

log = logging.getLogger("service.produce")

T = TypeVar("T")

APP_ID = "expiry-service"
# A claim outlives the wait for confirms by this much; if the scan dies while
# publishing, its claims lapse and the next scan publishes those holds again.
CLAIM_MARGIN_SECONDS = 5.0
# After SIGTERM or SIGINT a pass only waits for the confirms in flight (at most
# the publish timeout), records them (a short transaction) and closes its
# connections (about 2 s for a broker that no longer answers). Past the publish
# timeout plus this margin it is cancelled and records nothing more: the claims
# of its pages in flight lapse on their own, at the latest CLAIM_MARGIN_SECONDS
# after the publish timeout, and a later scan publishes those holds again (a
# command confirmed but not yet recorded is then sent twice; the consumer finds
# its second delivery already done).
STOP_MARGIN_SECONDS = 5.0
SIGNALS = (signal.SIGTERM, signal.SIGINT)
ABANDONED = (
    "stopped by a signal, then cancelled after {:g}s before its last confirms were "
    "recorded; their claims lapse on their own and the next scan publishes the rest"
)


@dataclass
class ScanResult:
    """What one scan did."""

    published: int = 0
    failed: int = 0
    batches: int = 0
    stopped: bool = False  # ended before its last page, ``stop`` being set


class ScanStopped(ServiceError):
    """The scan was stopped by SIGTERM or SIGINT before it finished."""

    def __init__(self, result: ScanResult, message: str | None = None) -> None:
        unconfirmed = f", {result.failed} not confirmed" if result.failed else ""
        super().__init__(
            message
            or f"stopped by a signal before finishing: {result.published} command(s) "
            f"confirmed{unconfirmed}; the next scan publishes the rest"
        )
        self.result = result


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


async def scan(
    settings: Settings, *, stop: asyncio.Event | None = None, check: bool = True
) -> ScanResult:
    """Run one scan; raise ``PublishNotConfirmed`` if any publish was not confirmed.

    Once ``stop`` is set the scan claims and publishes nothing more (while it is
    still connecting it gives up as soon as it can) and raises ``ScanStopped``.
    With ``check`` it first checks the topology (``TopologyMismatch`` if it differs).
    """
    stop = stop or asyncio.Event()
    async with contextlib.AsyncExitStack() as opened:
        # The broker first: if it is down, nothing is claimed and nothing recorded.
        connection = await _connect_broker(settings, stop, opened)
        prepared = _prepare(settings, connection, opened, check=check)
        conn, exchange = await _unless_stopped(stop, prepared)
        result = await scan_pass(conn, exchange, settings, stop=stop)
    if result.stopped:
        raise ScanStopped(result)
    if result.failed:
        raise PublishNotConfirmed(
            f"{result.failed} command(s) not confirmed by the broker "
            f"({result.published} confirmed); the next scan publishes them again"
        )
    return result


async def _connect_broker(
    settings: Settings, stop: asyncio.Event, opened: contextlib.AsyncExitStack
) -> AbstractRobustConnection:
    """Connect to the broker, unless stopped first (closed with ``opened``)."""
    name = f"expiry-produce {settings.worker_id}"
    connection = await _unless_stopped(stop, broker.connect(settings, name=name))
    opened.push_async_callback(connection.close)
    return connection


async def _prepare(
    settings: Settings,
    connection: AbstractRobustConnection,
    opened: contextlib.AsyncExitStack,
    *,
    check: bool,
) -> tuple[db.Connection, AbstractExchange]:
    """Check the topology (it declares nothing) and connect to the database (closed with
    ``opened``)."""
    if check:
        await check_topology(connection, settings)
    channel = await broker.open_confirm_channel(connection)
    exchange = await channel.get_exchange(EXCHANGE, ensure=False)
    conn = await db.connect(settings, application_name="expiry-produce")
    opened.push_async_callback(conn.close)
    return conn, exchange


async def _unless_stopped(stop: asyncio.Event, step: Coroutine[Any, Any, T]) -> T:
    """Await ``step``; if ``stop`` is set first, cancel it and raise ``ScanStopped``."""
    task = asyncio.ensure_future(step)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((task, stopping), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait((task,))
    if task.cancelled():
        raise ScanStopped(ScanResult(stopped=True))
    return task.result()


async def scan_pass(
    conn: db.Connection,
    exchange: AbstractExchange,
    settings: Settings,
    *,
    stop: asyncio.Event | None = None,
) -> ScanResult:
    """Publish every due hold without a live lease, as of the scan's start.

    Pipelined two pages deep: while one page's confirms come in, the next page
    is claimed and published, and the page before is recorded; so neither the
    broker nor the database waits for the other, and at most two pages are in
    memory whatever the backlog. Once ``stop`` is set no page is claimed or
    published any more: the pages in flight are recorded, and a pass that ends
    before its last page says ``stopped``.
    """
    result = ScanResult()
    stop = stop or asyncio.Event()
    until = await db.db_now(conn)
    cursor = (db.EPOCH_START, db.NIL_UUID)
    previous: Publishing | None = None
    try:
        while not _stopping(stop, result):
            page, batch = await claim_page(conn, settings, until=until, after=cursor)
            if _stopping(stop, result):
                await db.release_claims(conn, [hold.id for hold in batch])
                break
            pending = previous
            previous = Publishing(batch, settings.publish_timeout_seconds, exchange)
            if pending is not None:
                await record_page(conn, settings, pending, result)
            if not page or len(page) < settings.scan_batch_size:
                break
            if _stopping(stop, result) or result.failed:
                break
            cursor = (page[-1].hold_until, page[-1].id)
    finally:
        if previous is not None:
            await record_last_page(conn, settings, previous, result)
    return result


def _stopping(stop: asyncio.Event, result: ScanResult) -> bool:
    """Whether the pass must stop before its next page (noted in ``result``)."""
    result.stopped = stop.is_set()
    return result.stopped


class Publishing:
    """One page's commands on their way: published at once, confirms awaited later."""

    def __init__(self, batch: list[db.DueHold], timeout: float, exchange: AbstractExchange) -> None:
        self.batch = batch
        self.task = asyncio.ensure_future(publish_batch(exchange, batch, timeout))


async def record_last_page(
    conn: db.Connection, settings: Settings, page: Publishing, result: ScanResult
) -> None:
    """Record the page still in flight, unless the pass is being cancelled: then its
    publishes are abandoned too, and its claims lapse on their own."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        page.task.cancel()
        return
    await record_page(conn, settings, page, result)


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


async def _scan_and_report(
    settings: Settings, *, stop: asyncio.Event | None = None, check: bool = True
) -> None:
    started = time.monotonic()
    result = await scan(settings, stop=stop, check=check)
    elapsed = time.monotonic() - started
    print(
        f"scan: published {result.published} command(s) in {result.batches} batch(es), "
        f"all confirmed, {elapsed:.2f}s",
        flush=True,
    )


async def scan_every(settings: Settings, interval: float, stop: asyncio.Event) -> None:
    """Start a scan every ``interval`` seconds (start to start) until ``stop``.

    A pass that takes longer than ``interval`` is followed by the next at once
    (no burst to catch up); a failed scan is logged, not fatal, except a topology
    that differs (``TopologyMismatch``), which stops it: the topology is checked
    until one pass got past the check, then no more; ``stop`` also stops the pass
    under way (see ``scan``).
    """
    loop = asyncio.get_running_loop()
    next_start = loop.time()
    checked = False
    while not stop.is_set():
        next_start += interval
        checked = await _pass_on_timer(settings, stop, check=not checked) or checked
        now = loop.time()
        if next_start < now:
            next_start = now
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(next_start - now):
                await stop.wait()


async def _pass_on_timer(settings: Settings, stop: asyncio.Event, *, check: bool) -> bool:
    """One pass of ``--every``: its failure, or its early stop, is logged; a topology that
    differs is raised. Returns whether the pass got past the topology check."""
    try:
        await _scan_and_report(settings, stop=stop, check=check)
    except TopologyMismatch:
        raise
    except ScanStopped as stopped:
        facts = {"published": stopped.result.published, "failed": stopped.result.failed}
        log.info("scan.stopped", extra=facts)
        return False
    except PublishNotConfirmed:
        log.exception("scan.failed")
        return True
    except Exception:
        log.exception("scan.failed")
        return False
    return True


@contextlib.contextmanager
def _stop_on_signals(
    stop: asyncio.Event, deadline: asyncio.Timeout, bound: float
) -> Iterator[None]:
    """On SIGTERM or SIGINT set ``stop``, and give what runs ``bound`` seconds more."""
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if not stop.is_set():
            stop.set()
            deadline.reschedule(loop.time() + bound)

    for signum in SIGNALS:
        loop.add_signal_handler(signum, on_signal)
    try:
        yield
    finally:
        for signum in SIGNALS:
            loop.remove_signal_handler(signum)


async def _main(settings: Settings, args: argparse.Namespace) -> int:
    tracing = telemetry.setup_tracing(settings, "produce")
    try:
        await _run_until_stopped(settings, args.every)
    finally:
        telemetry.shutdown(tracing)
    return 0


async def _run_until_stopped(settings: Settings, every: float | None) -> None:
    """One scan, or scans every ``every`` seconds, until done or stopped by a signal."""
    stop = asyncio.Event()
    bound = settings.publish_timeout_seconds + STOP_MARGIN_SECONDS
    deadline = asyncio.timeout(None)
    try:
        async with deadline:
            with _stop_on_signals(stop, deadline, bound):
                if every is None:
                    await _scan_and_report(settings, stop=stop)
                else:
                    await scan_every(settings, every, stop)
    except TimeoutError:
        if not deadline.expired():
            raise
        if every is None:
            raise ScanStopped(ScanResult(stopped=True), ABANDONED.format(bound)) from None
        log.warning("scan.abandoned", extra={"after_seconds": bound})


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
