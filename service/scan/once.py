"""One scan: publish a command, with publisher confirms, for every due hold.

One bounded pass, oldest deadline first, in keyset pages. Each page is locked
(``FOR NO KEY UPDATE SKIP LOCKED``, so that overlapping scans split the work)
and claimed with a short lease in one short transaction; then published with
confirms, one window for the page; then the lease of each confirmed command is
extended, and the claims of the others lapse at once.

Once ``stop`` is set a pass stops between pages: nothing more is claimed or
published, the confirms in flight are awaited and recorded as usual.

A one-shot scan opens its connections and closes them at its end; a scanner on
a timer passes ``Links`` that keep them from one pass to the next while the
passes succeed (a pass that fails or stops closes them: the next one connects
afresh, to the first node of ``AMQP_URL`` that answers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

from aio_pika.abc import AbstractChannel, AbstractRobustConnection

from service.adapters import amqp, postgres
from service.adapters.amqp.declaring import check_topology
from service.adapters.amqp.page_publisher import Command, PagePublisher
from service.adapters.classify import classify
from service.adapters.postgres.leases import PassResult, record_pass
from service.adapters.telemetry import recorder_for
from service.adapters.telemetry.gauges import read_gauges
from service.adapters.telemetry.readings import Gauges
from service.core.domain import command_body, message_id
from service.core.errors import PublishNotConfirmed, ServiceError
from service.core.topology import EXCHANGE, ROUTING_KEY
from service.settings import Settings

log = logging.getLogger("service.produce")

T = TypeVar("T")

# A claim outlives the wait for confirms by this much; if the scan dies while
# publishing, its claims lapse and the next scan publishes those holds again.
CLAIM_MARGIN_SECONDS = 5.0


@dataclass
class ScanResult:
    """What one scan did."""

    published: int = 0
    failed: int = 0
    batches: int = 0
    lapsed: int = 0  # published again: their lease had lapsed with the hold still held
    stopped: bool = False  # ended before its last page, ``stop`` being set
    progressed_at: float = field(default_factory=time.monotonic)  # the last page recorded
    started_at: datetime | None = None  # the database's now() that decided what was due


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


async def scan_once(
    settings: Settings,
    *,
    stop: asyncio.Event | None = None,
    check: bool = True,
    result: ScanResult | None = None,
    gauges: Gauges | None = None,
    links: Links | None = None,
) -> ScanResult:
    """Run one scan; raise ``PublishNotConfirmed`` if any publish was not confirmed.

    Once ``stop`` is set the scan claims and publishes nothing more (while it is
    still connecting it gives up as soon as it can) and raises ``ScanStopped``.
    With ``check`` it first checks the topology (``TopologyMismatch`` if it differs).
    ``result`` is filled in as the pass goes (what it did, even if it raises);
    ``gauges`` are read from the database after the pass. With ``links`` the scan uses
    (or opens) their connections and leaves them open if it succeeds; without, it
    opens its own and closes them.
    """
    stop = stop or asyncio.Event()
    result = result if result is not None else ScanResult()
    kept = links is not None
    links = links if links is not None else Links()
    conn: postgres.Connection | None = None
    try:
        conn, publisher = await links.open(settings, stop, check=check)
        await scan_pass(conn, publisher, settings, stop=stop, result=result)
        await _record_pass(conn, settings, result)
        if gauges is not None:
            await _read_gauges(conn, gauges)
    except Exception:
        if conn is not None:
            await _record_pass(conn, settings, result, failed=True)
        await links.close()
        raise
    except BaseException:
        await links.close()
        raise
    if not kept or result.stopped or result.failed:
        await links.close()
    if result.stopped:
        raise ScanStopped(result)
    if result.failed:
        raise PublishNotConfirmed(
            f"{result.failed} command(s) not confirmed by the broker "
            f"({result.published} confirmed); the next scan publishes them again"
        )
    return result


async def _record_pass(
    conn: postgres.Connection, settings: Settings, result: ScanResult, *, failed: bool = False
) -> None:
    """How the pass went, and when it started, for status, verify and the console (the
    last pass per scanner); ``failed``: it raised. A failure to record is logged."""
    try:
        # A failed pass's connection may hang: its record waits a short while at most.
        async with asyncio.timeout(CLAIM_MARGIN_SECONDS if failed else None):
            await record_pass(
                conn,
                settings.worker_id,
                started_at=result.started_at,
                result=_outcome(result, failed=failed),
                published=result.published,
                unconfirmed=result.failed,
            )
    except Exception as exc:
        log.warning("scan.record_failed", extra={"error_class": classify(exc)[1]})


def _outcome(result: ScanResult, *, failed: bool) -> PassResult:
    if failed:
        return PassResult.FAILED
    if result.stopped:
        return PassResult.STOPPED
    return PassResult.UNCONFIRMED if result.failed else PassResult.OK


async def _read_gauges(conn: postgres.Connection, gauges: Gauges) -> None:
    """The backlog and the clock drift, for the scanner's /metrics; a failure is logged."""
    try:
        await read_gauges(conn, gauges, dead_letters=False)  # the scan's role may not read them
    except Exception as exc:
        log.warning("metrics.refresh_failed", extra={"error_class": classify(exc)[1]})


@dataclass
class _Open:
    """Connections open for a scan, and what closes them."""

    broker: AbstractRobustConnection
    channel: AbstractChannel
    publisher: PagePublisher
    conn: postgres.Connection
    closing: contextlib.AsyncExitStack

    def usable(self) -> bool:
        """Whether none was lost: the broker connection, its channel, the database's."""
        return (
            not self.broker.is_closed
            and self.broker.connected.is_set()
            and not self.channel.is_closed
            and not self.conn.is_closed()
        )


class Links:
    """A scan's connections: to the broker (with a confirm channel) and to the database.

    Opened by the first pass that needs them and kept while they work: a pass
    finds them again unless the broker connection, its channel or the database
    connection was lost meanwhile, and then opens new ones. ``close`` forgets them.
    """

    def __init__(self) -> None:
        self._open: _Open | None = None

    async def open(
        self, settings: Settings, stop: asyncio.Event, *, check: bool
    ) -> tuple[postgres.Connection, PagePublisher]:
        """The connections, opened now unless still usable; with ``check`` the topology
        is checked (it declares nothing), on kept connections too."""
        if self._open is not None and self._open.usable():
            if check:
                await _unless_stopped(stop, check_topology(self._open.broker, settings))
            return self._open.conn, self._open.publisher
        await self.close()
        async with contextlib.AsyncExitStack() as opened:
            # The broker first: if it is down, nothing is claimed and nothing recorded.
            broker = await _connect_broker(settings, stop, opened)
            prepared = _prepare(settings, broker, opened, check=check)
            conn, channel = await _unless_stopped(stop, prepared)
            publisher = PagePublisher(
                channel, EXCHANGE, ROUTING_KEY, recorder_for("service.produce")
            )
            self._open = _Open(broker, channel, publisher, conn, opened.pop_all())
        return conn, publisher

    async def close(self) -> None:
        """Close what is open (nothing to do if nothing is)."""
        held, self._open = self._open, None
        if held is not None:
            await held.closing.aclose()


async def _connect_broker(
    settings: Settings, stop: asyncio.Event, opened: contextlib.AsyncExitStack
) -> AbstractRobustConnection:
    """Connect to the broker, unless stopped first (closed with ``opened``)."""
    name = f"expiry-produce {settings.worker_id}"
    connection = await _unless_stopped(stop, amqp.connect(settings, name=name))
    opened.push_async_callback(connection.close)
    return connection


async def _prepare(
    settings: Settings,
    connection: AbstractRobustConnection,
    opened: contextlib.AsyncExitStack,
    *,
    check: bool,
) -> tuple[postgres.Connection, AbstractChannel]:
    """Check the topology (it declares nothing), open the confirm channel and connect to
    the database (closed with ``opened``)."""
    if check:
        await check_topology(connection, settings)
    channel = await amqp.open_confirm_channel(connection)
    conn = await postgres.connect(settings, application_name="expiry-produce")
    opened.push_async_callback(conn.close)
    return conn, channel


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
    conn: postgres.Connection,
    publisher: PagePublisher,
    settings: Settings,
    *,
    stop: asyncio.Event | None = None,
    result: ScanResult | None = None,
) -> ScanResult:
    """Publish every due hold without a live lease, as of the scan's start (into ``result``).

    Pipelined two pages deep: while one page's confirms come in, the next page
    is claimed and published, and the page before is recorded; so neither the
    broker nor the database waits for the other, and at most two pages are in
    memory whatever the backlog. Once ``stop`` is set no page is claimed or
    published any more: the pages in flight are recorded, and a pass that ends
    before its last page says ``stopped``.
    """
    result = result if result is not None else ScanResult()
    stop = stop or asyncio.Event()
    until = result.started_at = await postgres.db_now(conn)
    cursor = (postgres.EPOCH_START, postgres.NIL_UUID)
    previous: Publishing | None = None
    try:
        while not _stopping(stop, result):
            page, batch = await claim_page(conn, settings, until=until, after=cursor)
            if _stopping(stop, result):
                await postgres.release_claims(conn, [hold.id for hold in batch])
                break
            pending = previous
            previous = Publishing(batch, settings.publish_timeout_seconds, publisher)
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

    def __init__(
        self, batch: list[postgres.DueHold], timeout: float, publisher: PagePublisher
    ) -> None:
        self.batch = batch
        self.task = asyncio.ensure_future(publish_batch(publisher, batch, timeout))


async def record_last_page(
    conn: postgres.Connection, settings: Settings, page: Publishing, result: ScanResult
) -> None:
    """Record the page still in flight, unless the pass is being cancelled: then its
    publishes are abandoned too, and its claims lapse on their own."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        page.task.cancel()
        return
    await record_page(conn, settings, page, result)


async def record_page(
    conn: postgres.Connection, settings: Settings, page: Publishing, result: ScanResult
) -> None:
    """Wait for a page's confirms; extend the leases of the confirmed, lapse the others."""
    try:
        confirmed = await page.task
    except BaseException:
        page.task.cancel()
        raise
    done = {hold.id for hold in confirmed}
    failed = [hold.id for hold in page.batch if hold.id not in done]
    async with postgres.transaction(conn):
        result.lapsed += await postgres.record_leases(
            conn, [hold.id for hold in confirmed], lease_seconds=settings.lease_seconds
        )
        await postgres.release_claims(conn, failed)
    result.progressed_at = time.monotonic()
    if page.batch:
        result.batches += 1
    result.published += len(confirmed)
    result.failed += len(failed)


async def claim_page(
    conn: postgres.Connection, settings: Settings, *, until: datetime, after: tuple[datetime, UUID]
) -> tuple[list[postgres.DueHold], list[postgres.DueHold]]:
    """Lock the next page, claim it with a short lease, commit: locks last milliseconds.

    Returns the page (for the cursor) and the holds this scan claimed in it.
    """
    async with postgres.transaction(conn):
        page = await postgres.claim_due(
            conn, until=until, after=after, limit=settings.scan_batch_size
        )
        claimed = await postgres.claim_leases(
            conn,
            [hold.id for hold in page],
            [message_id(hold.id, hold.hold_until) for hold in page],
            claim_seconds=settings.publish_timeout_seconds + CLAIM_MARGIN_SECONDS,
        )
    return page, [hold for hold in page if hold.id in claimed]


async def publish_batch(
    publisher: PagePublisher, batch: list[postgres.DueHold], timeout: float
) -> list[postgres.DueHold]:
    """Publish a page, its commands' frames in one write and one deadline for all their
    confirms; return the holds whose commands the broker confirmed."""
    commands = [
        Command(command_body(hold.id, hold.hold_until), message_id(hold.id, hold.hold_until))
        for hold in batch
    ]
    outcomes = await publisher.publish(commands, timeout=timeout)
    confirmed: list[postgres.DueHold] = []
    for hold, reason in zip(batch, outcomes, strict=True):
        if reason is None:
            confirmed.append(hold)
        else:
            log.warning(
                "expiry.publish_failed", extra={"reservation_id": str(hold.id), "reason": reason}
            )
    return confirmed
