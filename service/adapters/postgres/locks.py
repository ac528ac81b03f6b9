"""Advisory locks held through any pooler: the lock belongs to a transaction left open on
a connection of its own for the block (a transaction pooler keeps a client's server
session for as long as its transaction lasts, and no longer), and goes with it, at the
block's end or when the process dies (the server, or the pooler, ends that transaction).

Used where one run at a time must hold for a whole run of several transactions: migrate,
retention, a walk of the dead queue. The work itself runs on other connections.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from service.adapters.postgres.pool import PlainConnection, connect
from service.settings import Settings

TRY_LOCK = "SELECT pg_try_advisory_xact_lock($1)"
BEGIN = "BEGIN"
ROLLBACK = "ROLLBACK"
POLL_SECONDS = 0.2
CLOSE_SECONDS = 5.0


class LockBusy(Exception):
    """Another run held the lock for longer than the wait."""


@contextlib.asynccontextmanager
async def holding(
    settings: Settings,
    key: int,
    *,
    wait: float,
    name: str,
    waiting: Callable[[], None] | None = None,
) -> AsyncIterator[None]:
    """The advisory lock ``key`` for the block, once another holder has let it go (polled
    every ``POLL_SECONDS``, ``waiting`` called once when it must wait; ``LockBusy`` after
    ``wait`` seconds). Its connection (``application_name`` ``name``) holds only the lock:
    it sits idle in its transaction, which no timeout of the service's ends."""
    conn = await connect(settings, application_name=name)
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        told = False
        # Each try is a transaction of its own, given back when the lock is not had: a
        # waiter pins no server session of a pooler (the holder's run may need it).
        while not await _tried(conn, key):
            if loop.time() >= deadline:
                raise LockBusy
            if waiting is not None and not told:
                waiting()
                told = True
            await asyncio.sleep(POLL_SECONDS)
        yield
    finally:
        # The lock ends with the transaction: rolled back (nothing was written), or, on
        # a connection that broke, with its session.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.execute(ROLLBACK), timeout=CLOSE_SECONDS)
        conn.terminate()


async def _tried(conn: PlainConnection, key: int) -> bool:
    """A transaction that holds the lock (True), or none (False: it was another's)."""
    await conn.execute(BEGIN)
    if await conn.fetchval(TRY_LOCK, key):
        return True
    await conn.execute(ROLLBACK)
    return False
