"""How many messages a queue holds and how many consumers it has: the broker's own figures.

A passive ``queue.declare`` answers with both, exact at that moment, and needs
no permission beyond the vhost. It goes to the AMQP channel underneath
aio-pika's objects: a robust channel keeps every queue it declared and, since
aio-pika 10, answers a passive declare of a name it knows from that memory,
figures and all, without asking the broker. The status screen, the demo, the
benchmark and the tests read queues through ``QueueProbe``.
"""

from __future__ import annotations

from dataclasses import dataclass

import aiormq.exceptions
from aio_pika.abc import AbstractChannel, AbstractConnection


@dataclass(frozen=True)
class QueueCounts:
    """What the broker said of one queue."""

    ready: int  # messages waiting to be delivered (not those delivered and unacked)
    consumers: int


async def queue_counts(channel: AbstractChannel, name: str) -> QueueCounts:
    """The broker's figures for queue ``name``; ``ChannelNotFoundEntity`` if there is none
    (the broker then closes the channel)."""
    underlay = await channel.get_underlay_channel()
    declared = await underlay.queue_declare(name, passive=True)
    return QueueCounts(int(declared.message_count or 0), int(declared.consumer_count or 0))


class QueueProbe:
    """Passive declares on one connection, on a channel of their own (a fresh one after the
    broker closed it over a missing queue)."""

    def __init__(self, connection: AbstractConnection) -> None:
        self.connection = connection
        self._channel: AbstractChannel | None = None

    async def channel(self) -> AbstractChannel:
        """The probe's channel, open."""
        if self._channel is None or self._channel.is_closed:
            self._channel = await self.connection.channel(publisher_confirms=False)
        return self._channel

    async def counts(self, name: str) -> QueueCounts | None:
        """The figures of queue ``name``, or None if it does not exist."""
        try:
            return await queue_counts(await self.channel(), name)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return None

    async def ready(self, name: str) -> int:
        """Messages ready in queue ``name`` (0 if it does not exist)."""
        found = await self.counts(name)
        return found.ready if found is not None else 0

    async def consumers(self, name: str) -> int:
        """Consumers of queue ``name`` (0 if it does not exist)."""
        found = await self.counts(name)
        return found.consumers if found is not None else 0

    async def close(self) -> None:
        """Close the probe's channel (the connection stays the caller's)."""
        if self._channel is not None and not self._channel.is_closed:
            await self._channel.close()
