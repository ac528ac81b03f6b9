"""The holds the demo places, and the support side that consumes some at their deadline."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

from service.adapters import postgres
from service.adapters.postgres import demo as demo_sql
from service.demo.plan import Plan


@dataclass(frozen=True)
class Hold:
    """A placed hold, and when it is due on the event loop's clock."""

    id: UUID
    hold_until: datetime
    due_at: float  # loop.time() of the deadline


async def place_holds(conn: postgres.Connection, plan: Plan) -> list[Hold]:
    """Insert the holds; map their deadlines (database clock) onto the loop's clock."""
    placed = await demo_sql.place_holds(conn, plan.holds, lead=plan.lead, spread=plan.spread)
    db_now = await postgres.db_now(conn)
    loop_now = asyncio.get_running_loop().time()
    return [
        Hold(id_, hold_until, loop_now + (hold_until - db_now).total_seconds())
        for id_, hold_until in placed
    ]


@dataclass
class Support:
    """What the support side did: the holds it consumed, and how many it found expired."""

    tried: int = 0
    consumed: set[UUID] = field(default_factory=set)
    too_late: int = 0


async def support_side(
    pool: postgres.Pool, picks: Sequence[Hold], rng: random.Random, result: Support
) -> None:
    """Consume each picked hold right at its deadline (up to 0.2 s before, 0.6 s after).

    ``result`` is filled in as it goes, so that it tells what was done even if stopped.
    """
    result.tried = len(picks)
    loop = asyncio.get_running_loop()

    async def consume(hold: Hold) -> None:
        await asyncio.sleep(max(0.0, hold.due_at + rng.uniform(-0.2, 0.6) - loop.time()))
        async with pool.acquire() as conn:
            consumed = await demo_sql.consume_hold(conn, hold.id)
        if consumed:
            result.consumed.add(hold.id)
        else:
            result.too_late += 1

    await asyncio.gather(*(consume(hold) for hold in picks))
