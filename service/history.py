"""History for late subscribers, as an operator asks for it: a backfill of a webhook
endpoint (``python -m service.deliver --backfill``) and a replay to one queue
(``python -m service.relay --replay-to``). Both take the events written in a window
that the service still keeps, with their ids; both name the operator (one of
``EXPIRY_REPLAY_OPERATORS``), are audited (``history_requests``), and tell how many
events they queued or published.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from datetime import UTC, datetime

import aio_pika

from service.adapters import amqp, postgres
from service.adapters.amqp.page_publisher import Command, PagePublisher
from service.adapters.postgres import history_rows, webhook_endpoints
from service.adapters.postgres.schema import require_current_schema
from service.core.errors import ServiceError, UsageError
from service.core.events import EVENT, event_body
from service.core.windows import NotATime, Window, window
from service.ops.dead_letters import actor_named, refusal
from service.settings import Settings

# Events read and published at a time by a replay to a queue.
REPLAY_PAGE = 500

log = logging.getLogger("service.history")


def add_window_arguments(parser: argparse.ArgumentParser, flag: str) -> None:
    """``--since``, ``--until`` and ``--operator``, as ``flag`` (``--backfill``,
    ``--replay-to``) takes them."""
    parser.add_argument(
        "--since",
        metavar="TIME",
        help=f"with {flag}: from when (ISO 8601, UTC without an offset, or how long ago: "
        "90m, 6h, 3d, 2w)",
    )
    parser.add_argument("--until", metavar="TIME", help=f"with {flag}: to when (default: now)")
    parser.add_argument("--operator", help=f"with {flag}: who asks (audited)")


def asked(since: str | None, until: str | None, flag: str) -> Window:
    """The window of a command line's ``--since`` (required) and ``--until``, or a
    one-line refusal."""
    if since is None:
        raise UsageError(f"{flag} needs --since TIME: the events written from when")
    try:
        return window(since, until, datetime.now(UTC))
    except NotATime as exc:
        raise UsageError(str(exc)) from None


def allowed(settings: Settings, actor: postgres.Actor, doing: str) -> None:
    """Refuse (one line) an operator who may not replay: history is a replay too."""
    why = refusal(settings, actor, doing)
    if why is not None:
        raise UsageError(why)


async def backfill(
    settings: Settings,
    endpoint: str,
    window: Window,
    operator: str | None,
    *,
    say: Callable[[str], None],
) -> int:
    """Queue for ``endpoint`` every event written in ``window`` that is kept (one whose
    delivery to it waits already is left as it is); the running deliverers send them with
    their ``webhook-id``. Audited; 0."""
    actor = actor_named(operator)
    allowed(settings, actor, "backfill")
    opened = postgres.pooled(settings, name="expiry-deliver backfill", size=1)
    async with opened as pool, pool.acquire() as conn:
        await require_current_schema(conn)
        names = {row.endpoint for row in await webhook_endpoints.backlog(conn)}
        if endpoint not in names:
            raise UsageError(
                f"--backfill: no endpoint {endpoint!r} is registered: start a deliverer with it "
                "first (it registers its endpoints), then backfill it"
            )
        async with postgres.transaction(conn):
            found, queued = await history_rows.backfill(conn, endpoint, window.since, window.until)
            request = history_rows.Request(
                "backfill", endpoint, window.since, window.until, queued, "done", actor
            )
            await history_rows.record(conn, request)
    say(
        f"backfill of endpoint {endpoint} {window.describe()}: {queued} event(s) queued, of "
        f"{found} kept ({found - queued} already waiting for it); the deliverers running with "
        "it send them, each with its webhook-id"
    )
    log.info(
        "webhook.backfilled",
        extra={
            "endpoint": endpoint,
            "since": window.since.isoformat(),
            "until": window.until.isoformat(),
            "queued": queued,
            "operator": actor.operator,
        },
    )
    return 0


class ReplayIncomplete(ServiceError):
    """Some events of a replay to a queue were not confirmed by the broker."""


async def replay_to(
    settings: Settings,
    queue: str,
    window: Window,
    operator: str | None,
    *,
    say: Callable[[str], None],
) -> int:
    """Publish again to ``queue`` alone (the default exchange, routing key the queue's
    name, mandatory, with confirms) every event written in ``window`` that is kept, with
    its ``message_id``; no other reader receives a copy. Audited; 0 when every one was
    confirmed (``ReplayIncomplete`` otherwise: the next run publishes them again, and
    readers deduplicate by message id)."""
    actor = actor_named(operator)
    allowed(settings, actor, "replay to a queue")
    async with (
        postgres.connected(settings, name="expiry-relay replay-to") as conn,
        amqp.connected(settings, name=f"expiry-relay replay-to {queue}") as connection,
    ):
        await require_current_schema(conn)
        channel = await amqp.open_confirm_channel(connection)
        try:
            await channel.declare_queue(queue, passive=True)  # no permission needed
        except aio_pika.exceptions.ChannelNotFoundEntity:
            raise UsageError(
                f"--replay-to: no queue {queue!r} on the broker: declare and bind it first "
                "(docs/events.md)"
            ) from None
        channel = await amqp.open_confirm_channel(connection)  # a refusal closed the first
        publisher = PagePublisher(channel, "", queue, message_type=EVENT)
        published, failed = await _publish_window(conn, publisher, window, settings)
        outcome = "done" if not failed else "partial"
        request = history_rows.Request(
            "replay-to", queue, window.since, window.until, published, outcome, actor
        )
        await history_rows.record(conn, request)
    say(
        f"replay to queue {queue} {window.describe()}: {published} event(s) published and "
        f"confirmed, {failed} not"
        + ("" if not failed else " (run it again: readers deduplicate by message id)")
    )
    log.info(
        "events.replayed_to",
        extra={
            "queue": queue,
            "published": published,
            "failed": failed,
            "operator": actor.operator,
        },
    )
    if failed:
        raise ReplayIncomplete(f"{failed} event(s) were not confirmed by the broker")
    return 0


async def _publish_window(
    conn: postgres.Connection, publisher: PagePublisher, window: Window, settings: Settings
) -> tuple[int, int]:
    """Every kept event of the window, in pages, read in one pass: (confirmed, not)."""
    published = failed = 0
    page: list[Command] = []

    async def send() -> None:
        nonlocal published, failed
        outcomes = await publisher.publish(page, timeout=settings.publish_timeout_seconds)
        confirmed = sum(1 for why in outcomes if why is None)
        published, failed = published + confirmed, failed + len(outcomes) - confirmed
        page.clear()

    async with postgres.transaction(conn, isolation="repeatable_read", readonly=True):
        async for event in history_rows.kept(conn, window.since, window.until):
            body = event_body(event.reservation_id, event.hold_until, event.expired_at)
            page.append(Command(body, event.message_id))
            if len(page) >= REPLAY_PAGE:
                await send()
        if page:
            await send()
    return published, failed
