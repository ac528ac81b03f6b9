"""The benchmark's own look at its vhost: consumer counts, depths, purges.

The topology itself is declared by ``python -m service.declare``, run as the
deploy runs it, before any scan or consumer starts.
"""

from __future__ import annotations

import aiormq.exceptions
from aio_pika.abc import AbstractChannel, AbstractConnection

from bench.raw import RAW_EXCHANGE, RAW_QUEUE


class Probe:
    """Passive declares on one connection (a fresh channel after the broker closed one)."""

    def __init__(self, connection: AbstractConnection) -> None:
        self.connection = connection
        self._channel: AbstractChannel | None = None

    async def channel(self) -> AbstractChannel:
        if self._channel is None or self._channel.is_closed:
            self._channel = await self.connection.channel()
        return self._channel

    async def counts(self, queue: str) -> tuple[int, int]:
        """(ready messages, consumers) of ``queue``; (0, 0) if it does not exist."""
        channel = await self.channel()
        try:
            declared = await channel.declare_queue(queue, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return 0, 0
        result = declared.declaration_result
        return int(result.message_count or 0), int(result.consumer_count or 0)

    async def purge(self, queue: str) -> None:
        """Drop every ready message of ``queue``."""
        declared = await (await self.channel()).declare_queue(queue, passive=True)
        await declared.purge()

    async def delete_raw(self) -> None:
        """Remove the raw queue and exchange (between repetitions)."""
        channel = await self.channel()
        await channel.queue_delete(RAW_QUEUE)
        await channel.exchange_delete(RAW_EXCHANGE)
