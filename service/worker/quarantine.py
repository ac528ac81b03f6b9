"""Redelivered commands: someone held them and did not settle them (maybe they killed it).

Suspects go one at a time and alone, each attempt counted in the database
first: past ``CRASH_LIMIT`` counted attempts the command is dead-lettered
(``CrashLoop``) instead of crashing consumers until the broker's delivery
limit, taking the deliveries they hold with it each time. Each crash also
returns the deliveries the consumer held, one more delivery each, so this
stays well under the delivery limit.
"""

from __future__ import annotations

import asyncio
from uuid import UUID

from service.core.domain import Expiry
from service.core.errors import CrashLoop
from service.worker.delivery import Delivery
from service.worker.failpoints import Failpoints
from service.worker.ports import Store

CRASH_LIMIT = 2


class Quarantine:
    """Handles suspects serially, counting each attempt before it is made."""

    def __init__(self, store: Store, failpoints: Failpoints) -> None:
        self.store = store
        self.failpoints = failpoints
        self.lock = asyncio.Lock()

    async def expire(self, delivery: Delivery, reservation_id: UUID) -> Expiry:
        """The guarded update for a suspect, alone; ``CrashLoop`` past the limit."""
        key = delivery.attempt.message_id  # the dead-letter record's id too
        async with self.lock:
            handled = await self.store.mark_handling(key)
            if handled > CRASH_LIMIT:
                raise CrashLoop(f"a consumer died handling it {handled - 1} times")
            self.failpoints.on_handling(reservation_id)
            expiry = await self.store.expire_one(
                reservation_id, delivery.attempt, traceparent=delivery.traceparent()
            )
            await self.store.clear_handling(key)
            return expiry
