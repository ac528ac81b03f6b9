"""The benchmark's own look at its vhost: consumer counts, depths, purges.

The topology itself is declared by ``python -m service.declare``, run as the
deploy runs it, before any scan or consumer starts.
"""

from __future__ import annotations

from bench.raw import RAW_EXCHANGE, RAW_QUEUE
from service.adapters.amqp.queues import QueueProbe


class Probe(QueueProbe):
    """The service's queue probe, and what the benchmark does between its phases."""

    async def purge(self, queue: str) -> None:
        """Drop every ready message of ``queue``."""
        underlay = await (await self.channel()).get_underlay_channel()
        await underlay.queue_purge(queue)

    async def delete_raw(self) -> None:
        """Remove the raw queue and exchange (between repetitions)."""
        channel = await self.channel()
        await channel.queue_delete(RAW_QUEUE)
        await channel.exchange_delete(RAW_EXCHANGE)
