"""Walking ``expirations.dead``: each message taken once and settled one way.

A replay, a close and ``deadletters tidy`` each take every message of the
dead queue once (it has no order an operator can rely on, and no index), and
settle each one: republished then removed (a replay), removed as a copy of a
dead letter that is settled already (closed or replayed: its record keeps
what a replay needs to rebuild the command), or given back untouched
(``returns.give_back``, which never lets a message reach the queue's delivery
limit). A copy is removed only when its record already knows it: a copy
dead-lettered after the record's last sighting (not yet recorded) is kept.
One walk runs at a time (a lock in PostgreSQL): a walk holds every message it
took until its end, so a second walk at once would find none of them.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg
from aio_pika.abc import (
    AbstractChannel,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustConnection,
)

from service.adapters import amqp, postgres
from service.adapters.amqp.connection import UNREACHABLE
from service.adapters.amqp.returns import give_back
from service.adapters.postgres import revisions
from service.core.dead_letter import build_record
from service.core.errors import UsageError
from service.core.topology import DEAD_EXCHANGE, DEAD_QUEUE, EXCHANGE
from service.settings import Settings

# How long a walk waits for another to end.
WALK_WAIT_SECONDS = 120.0
# A dead letter in one of these states no longer needs its message in the queue.
SETTLED = ("closed", "replayed")


@dataclass(frozen=True)
class Copy:
    """One message taken from the dead queue: its dead letter's message id, and when it
    was dead-lettered (as the record would say)."""

    message: AbstractIncomingMessage
    key: str
    last_seen: datetime


def removable(copy: Copy, record: asyncpg.Record | Mapping[str, Any] | None) -> bool:
    """Whether ``copy`` is a copy of a settled dead letter that its record already knows."""
    return (
        record is not None and record["status"] in SETTLED and copy.last_seen <= record["last_seen"]
    )


@dataclass(eq=False)
class DeadQueue:
    """``expirations.dead`` for one walk: a channel to take from, a confirm channel to
    republish and give back on."""

    settings: Settings
    queue: AbstractQueue
    exchange: AbstractExchange
    dead_exchange: AbstractExchange

    @classmethod
    @contextlib.asynccontextmanager
    async def walk(
        cls, settings: Settings, connection: AbstractRobustConnection
    ) -> AsyncIterator[DeadQueue]:
        """The dead queue for one walk, the only one under way (another waits for it, up to
        WALK_WAIT_SECONDS: ``UsageError`` after), on channels of its own, closed after it."""
        try:
            async with (
                revisions.walking_dead_queue(settings, wait=WALK_WAIT_SECONDS),
                _channels(connection) as (publish_channel, get_channel),
            ):
                exchange = await publish_channel.get_exchange(EXCHANGE, ensure=False)
                dead_exchange = await publish_channel.get_exchange(DEAD_EXCHANGE, ensure=False)
                queue = await get_channel.get_queue(DEAD_QUEUE, ensure=True)
                yield cls(settings, queue, exchange, dead_exchange)
        except revisions.WalkBusy:
            raise UsageError(
                "another replay, close or tidy is walking expirations.dead: try again in a moment"
            ) from None

    async def take_all(self) -> list[Copy]:
        """Every message the queue holds now, taken (unacked) once each."""
        depth = (await self.queue.declare()).message_count or 0
        taken: list[Copy] = []
        for _ in range(depth):
            message = await self.queue.get(
                no_ack=False, fail=False, timeout=self.settings.publish_timeout_seconds
            )
            if message is None:
                break
            record = build_record(
                message.headers, message.body, message.message_id, datetime.now(UTC)
            )
            taken.append(Copy(message, record.message_id, record.last_seen))
        return taken

    async def remove(self, copy: Copy) -> bool:
        """Take ``copy`` off the queue for good."""
        return await amqp.settle(copy.message.ack, copy.key)

    async def give_back(self, copy: Copy) -> None:
        """Return ``copy`` to the queue (a fresh copy once it was returned often)."""
        await give_back(
            copy.message,
            dead_exchange=self.dead_exchange,
            queue=DEAD_QUEUE,
            timeout=self.settings.publish_timeout_seconds,
        )


@contextlib.asynccontextmanager
async def _channels(
    connection: AbstractRobustConnection,
) -> AsyncIterator[tuple[AbstractChannel, AbstractChannel]]:
    """A confirm channel to publish on and a channel to take from, closed at the end."""
    publish_channel = await amqp.open_confirm_channel(connection)
    try:
        get_channel = await connection.channel(publisher_confirms=False)
        try:
            yield publish_channel, get_channel
        finally:
            with contextlib.suppress(*amqp.CHANNEL_ERRORS):
                await get_channel.close()
    finally:
        with contextlib.suppress(*amqp.CHANNEL_ERRORS):
            await publish_channel.close()


@dataclass
class Tidied:
    """What a tidy of the dead queue did (or, dry, would do)."""

    removed: int = 0  # copies of closed or replayed dead letters
    open: int = 0  # kept: copies of open dead letters
    unrecorded: int = 0  # kept: no record yet, or dead-lettered again since it was recorded
    other: int = 0  # kept: settled dead letters this tidy was not asked about

    def line(self, *, dry_run: bool) -> str:
        """One line for people."""
        verb = "would remove" if dry_run else "removed"
        total = self.removed + self.open + self.unrecorded + self.other
        kept = f"kept {self.open} of open dead letters, {self.unrecorded} not recorded yet"
        if self.other:
            kept += f", {self.other} of other settled dead letters"
        return (
            f"expirations.dead held {total} message(s): {verb} {self.removed} "
            f"cop{'y' if self.removed == 1 else 'ies'} of closed or replayed dead letters; {kept}"
        )


async def tidy(
    settings: Settings,
    conn: postgres.Connection,
    connection: AbstractRobustConnection,
    *,
    only: set[str] | None = None,
    dry_run: bool = False,
) -> Tidied:
    """Remove the copies of closed or replayed dead letters (of ``only``'s message ids, if
    given) from the dead queue; give back every other message."""
    async with DeadQueue.walk(settings, connection) as dead:
        return await _tidy(dead, conn, only=only, dry_run=dry_run)


async def _tidy(
    dead: DeadQueue, conn: postgres.Connection, *, only: set[str] | None, dry_run: bool
) -> Tidied:
    copies = await dead.take_all()
    records = {
        row["message_id"]: row for row in await revisions.by_keys(conn, [c.key for c in copies])
    }
    done = Tidied()
    for copy in copies:
        record = records.get(copy.key)
        if removable(copy, record) and (only is None or copy.key in only):
            done.removed += 1
            if not dry_run and await dead.remove(copy):
                continue
        elif removable(copy, record):
            done.other += 1
        elif record is not None and record["status"] not in SETTLED:
            done.open += 1
        else:
            done.unrecorded += 1
        await dead.give_back(copy)
    return done


async def remove_copies(
    settings: Settings,
    conn: postgres.Connection,
    connection: AbstractRobustConnection | None,
    keys: set[str],
) -> str:
    """After a close: take the closed dead letters' messages (message ids ``keys``) off the
    dead queue; one line that says what became of them."""
    if not keys:
        return ""
    later = "python -m service.deadletters tidy removes them later"
    if connection is None:
        return f"their messages stay in expirations.dead: RabbitMQ cannot be reached ({later})"
    try:
        done = await tidy(settings, conn, connection, only=keys)
    except UNREACHABLE as exc:
        return f"their messages stay in expirations.dead: {type(exc).__name__} ({later})"
    return f"took {done.removed} of their message(s) off expirations.dead (the records keep them)"
