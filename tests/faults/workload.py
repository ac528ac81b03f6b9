"""Holds for a scenario, and the support side that consumes some of them meanwhile."""

from __future__ import annotations

import asyncio
import os
import random
from dataclasses import dataclass, field
from uuid import UUID

import asyncpg

from tests.faults.checks import Expectation

DEFAULT_HOLDS = 2000

INSERT_SQL = """
INSERT INTO reservations (id, hold_until)
SELECT gen_random_uuid(), now() + make_interval(secs => $2 + random() * $3)
  FROM generate_series(1, $1)
RETURNING id
"""

# The support side's own guarded update (the contract's), not the service's.
CONSUME_SQL = """
UPDATE reservations SET status = 'consumed', updated_at = now()
 WHERE id = $1 AND status = 'held'
RETURNING id
"""


def holds_from_environment() -> int:
    """The load size: ``FAULTS_HOLDS`` (default 2,000)."""
    return int(os.environ.get("FAULTS_HOLDS", str(DEFAULT_HOLDS)))


@dataclass
class Workload:
    """The holds of a scenario: due ones (in the past minute) and future ones (in an hour)."""

    due: list[UUID]
    future: list[UUID]
    dead: set[UUID] = field(default_factory=set)

    @property
    def holds(self) -> int:
        """How many holds in all."""
        return len(self.due) + len(self.future)

    def expectation(self, consumed: set[UUID]) -> Expectation:
        """The end state, once the support side consumed ``consumed``."""
        return Expectation(set(self.due), set(self.future), consumed, set(self.dead))

    def support_candidates(self, rng: random.Random, share: float = 0.03) -> list[UUID]:
        """A random few due and future holds for the support side to try to consume.

        Never one the scenario expects to end dead (a poison command): consumed
        before its command is published, it could never get there.
        """
        due = [hold for hold in self.due if hold not in self.dead]
        picked = rng.sample(due, max(1, int(len(due) * share)))
        picked += rng.sample(self.future, max(1, int(len(self.future) * share)))
        rng.shuffle(picked)
        return picked


async def insert_holds(url: str, count: int, *, due_in: float, spread: float = 0.0) -> list[UUID]:
    """Insert ``count`` held reservations due in ``due_in`` (+ up to ``spread``) seconds."""
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(INSERT_SQL, count, due_in, spread)
    finally:
        await conn.close()
    return [row["id"] for row in rows]


async def create_workload(url: str, due: int, future: int | None = None) -> Workload:
    """``due`` holds due within the past minute, ``future`` (default: a tenth) in an hour."""
    due_ids = await insert_holds(url, due, due_in=-61.0, spread=60.0)
    future_ids = await insert_holds(
        url, max(1, due // 10) if future is None else future, due_in=3600.0, spread=3600.0
    )
    return Workload(due_ids, future_ids)


SUPPORT_APPLICATION = "fault-support"

SUPPORT_WON_SQL = """
SELECT DISTINCT reservation_id FROM fault_transitions
 WHERE to_status = 'consumed' AND application = $1 AND reservation_id = ANY($2::uuid[])
"""


async def support_side(url: str, candidates: list[UUID], pause: float = 0.002) -> set[UUID]:
    """Consume ``candidates`` one by one with a guarded update; return those it won.

    Stops if the database goes away (a scenario may stop it); an update whose answer
    was lost then is looked up afterwards in the transition table (by application name).
    """
    won: set[UUID] = set()
    uncertain: list[UUID] = []
    try:
        conn = await asyncpg.connect(
            url, timeout=5, server_settings={"application_name": SUPPORT_APPLICATION}
        )
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
        return won
    try:
        for reservation_id in candidates:
            uncertain = [reservation_id]
            if await conn.fetchval(CONSUME_SQL, reservation_id) is not None:
                won.add(reservation_id)
            uncertain = []
            await asyncio.sleep(pause)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
        pass
    finally:
        if not conn.is_closed():
            conn.terminate()
    return won | await _resolve(url, uncertain)


async def _resolve(url: str, uncertain: list[UUID]) -> set[UUID]:
    """Which of ``uncertain`` the support side did consume (waits for the database)."""
    if not uncertain:
        return set()
    async with asyncio.timeout(120):
        while True:
            try:
                conn = await asyncpg.connect(url, timeout=5)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
                await asyncio.sleep(0.5)
                continue
            try:
                rows = await conn.fetch(SUPPORT_WON_SQL, SUPPORT_APPLICATION, uncertain)
            finally:
                await conn.close()
            return {row["reservation_id"] for row in rows}
