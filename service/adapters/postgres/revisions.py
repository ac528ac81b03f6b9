"""Dead letters with their revision, for an act's plan, and the claim that makes it exact.

A record's revision is the row version PostgreSQL gives it (``xmin``): every
change to the record (dead-lettered again, replayed, closed, reopened, given
an owner or a note) makes a new one. A plan lists the revisions its dry run
saw; confirming it claims each record only if its revision is still the same
(a compare-and-set that itself makes a new revision, so two confirmations of
one plan cannot both act; a group's members are read, a page at a time, by
``dead_letter_pages.py``). And the lock that lets one walk of
``expirations.dead`` run at a time.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence

import asyncpg

from service.adapters.postgres.dead_letter_rows import DEAD_LETTER_COLUMNS
from service.adapters.postgres.locks import LockBusy, holding
from service.adapters.postgres.pool import Connection
from service.settings import Settings

REVISIONED = f"{DEAD_LETTER_COLUMNS}, xmin::text AS revision"

BY_KEYS = f"""
SELECT {REVISIONED}
  FROM dead_letters
 WHERE id::text = ANY($1::text[]) OR message_id = ANY($1::text[])
 ORDER BY last_seen DESC, id DESC
"""

BY_IDS = f"SELECT {REVISIONED} FROM dead_letters WHERE id = ANY($1::bigint[])"

# The compare-and-set: a new row version only if the one the plan saw is still current.
CLAIM = """
UPDATE dead_letters SET status = status
 WHERE id = $1 AND xmin::text = $2
RETURNING xmin::text AS revision
"""


async def by_keys(conn: Connection, keys: Sequence[str]) -> list[asyncpg.Record]:
    """The dead letters with these record ids or message ids, newest first."""
    return await conn.fetch(BY_KEYS, list(keys))


async def by_ids(conn: Connection, ids: Sequence[int]) -> list[asyncpg.Record]:
    """The dead letters with these record ids (any order)."""
    return await conn.fetch(BY_IDS, list(ids))


async def claim(conn: Connection, dead_letter_id: int, revision: str) -> bool:
    """Claim the record for an act if it is still at ``revision``; False if it changed."""
    return await conn.fetchval(CLAIM, dead_letter_id, revision) is not None


# One walk of expirations.dead at a time (a replay, a close, a tidy): a walk takes
# every message it finds, unacked, so a second walk at the same time would find
# none of them. An arbitrary constant shared by every walker: hashtext('expirations.dead').
WALK_LOCK_KEY = 0x64656164


class WalkBusy(Exception):
    """Another walk of the dead queue held the lock for too long."""


@contextlib.asynccontextmanager
async def walking_dead_queue(settings: Settings, *, wait: float) -> AsyncIterator[None]:
    """Hold the walk of the dead queue for the block (waiting up to ``wait`` seconds for
    another walk to end: ``WalkBusy`` after); a process that dies lets it go."""
    try:
        async with holding(settings, WALK_LOCK_KEY, wait=wait, name="expiry-deadletters walk"):
            yield
    except LockBusy:
        raise WalkBusy from None
