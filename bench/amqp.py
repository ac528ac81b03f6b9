"""The benchmark's own look at its vhost: consumer counts, depths, purges.

The topology itself is declared by ``python -m service.declare``, run as the
deploy runs it, before any scan or consumer starts.
"""

from __future__ import annotations

from bench.raw import RAW_EXCHANGE, RAW_QUEUE
from service.adapters.amqp.queues import QueueProbe
from service.core.topology import EVENT_ROUTING_KEY, EVENTS_EXCHANGE

# A reader's queue of the events, as a downstream team binds one (docs/events.md): the
# relay publishes mandatory, so an event no queue would take is never confirmed. Quorum,
# as the raw publish's queue is.
EVENTS_QUEUE = "bench.events"


class Probe(QueueProbe):
    """The service's queue probe, and what the benchmark does between its phases."""

    async def purge(self, queue: str) -> None:
        """Drop every ready message of ``queue``."""
        underlay = await (await self.channel()).get_underlay_channel()
        await underlay.queue_purge(queue)

    async def bind_events(self) -> None:
        """The events' reader queue, declared and bound (again: it is idempotent)."""
        channel = await self.channel()
        queue = await channel.declare_queue(
            EVENTS_QUEUE, durable=True, arguments={"x-queue-type": "quorum"}
        )
        await queue.bind(EVENTS_EXCHANGE, EVENT_ROUTING_KEY)

    async def delete_raw(self) -> None:
        """Remove the raw queue and exchange (between repetitions)."""
        channel = await self.channel()
        await channel.queue_delete(RAW_QUEUE)
        await channel.exchange_delete(RAW_EXCHANGE)
