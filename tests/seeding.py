"""Real dead letters, made by the real service: holds whose retries run out while the
database is away, and poison bodies (shared by the dead-letter and console tests)."""

from __future__ import annotations

from uuid import UUID

from tests.recipes import consumer_cut_off, database_behind_proxy
from tests.support import (
    Stack,
    eventually,
    insert_holds,
    pg_connection,
    publish_raw,
    queue_depth,
)


async def seed_dead_letters(stack: Stack, *, exhausted: int = 1, poison: int = 1) -> list[UUID]:
    """``exhausted`` holds dead-lettered as ``db.unavailable`` / ``attempts-exhausted`` (the
    consumer's database cut, two attempts) and ``poison`` bodies (``junk-1``, ...), each
    recorded; returns the exhausted holds. Seeding again adds to what is there (without
    more poison: its message ids would repeat)."""
    dead_before = await queue_depth(stack.amqp_url, "expirations.dead")
    async with pg_connection(stack.database_url) as conn:
        records_before: int = await conn.fetchval("SELECT count(*) FROM dead_letters")
    ids = await insert_holds(stack.database_url, exhausted)
    async with (
        database_behind_proxy(stack, max_attempts=2, retry_delays=(1,)) as database,
        consumer_cut_off(stack, database),
    ):
        await publish_raw(
            stack.amqp_url,
            [b"<html>not a command</html>"] * poison,
            message_ids=[f"junk-{n}" for n in range(1, poison + 1)],
        )
        total = exhausted + poison

        async def all_dead() -> bool:
            depth = await queue_depth(stack.amqp_url, "expirations.dead")
            return depth == dead_before + total

        await eventually(all_dead, timeout=60)
        database.proxy.restore()  # the recorder can write the records now

        async def all_recorded() -> bool:
            async with pg_connection(stack.database_url) as conn:
                count: int = await conn.fetchval("SELECT count(*) FROM dead_letters")
            return count == records_before + total

        await eventually(all_recorded, timeout=60)
    return ids
