"""Scenario 14: workers whose clocks run minutes ahead and behind the database's.

Deadlines are compared with the database's clock only (``hold_until <= now()`` in
SQL), so a worker five minutes ahead must not expire a hold early, and one five
minutes behind must not leave one unexpired; the drift shows as
``expiry_clock_drift_seconds`` on each worker's /metrics. The clocks are skewed
with Debian's libfaketime (``LD_PRELOAD``), the wall clock only: the monotonic
clock, which timeouts use, is left alone.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from uuid import UUID

import asyncpg
import httpx
import pytest

from tests.faults.checks import settle, wait_for_consumers
from tests.faults.report import check_run
from tests.faults.scenario import Finished, settle_timeout, stop_cleanly
from tests.faults.workload import create_workload, holds_from_environment, insert_holds
from tests.faults.world import World
from tests.support import free_port, missing

pytestmark = pytest.mark.faults

LIBFAKETIME = "/usr/lib/*/faketime/libfaketime.so.1"  # Debian's, on any architecture
SKEWS = {"ahead": 300, "behind": -300, "scanner": 120}
DRIFT = re.compile(r"^expiry_clock_drift_seconds\{[^}]*\} (\S+)$", re.MULTILINE)
NOT_YET_DUE_SQL = """
SELECT count(*) FROM reservations WHERE id = ANY($1::uuid[]) AND hold_until > now()
"""
EARLY_SQL = """
SELECT count(*) FROM fault_transitions t JOIN reservations r ON r.id = t.reservation_id
 WHERE t.to_status = 'expired' AND t.at < r.hold_until
"""


@pytest.fixture
def libfaketime() -> Path:
    """Debian's libfaketime, or a skip (a failure under CI)."""
    found = sorted(Path("/").glob(LIBFAKETIME.lstrip("/")))
    if not found:
        missing("Debian's libfaketime is not installed (apt install faketime)")
    return found[0]


def skewed(library: Path, seconds: int) -> dict[str, str]:
    """The environment that runs a process with its wall clock ``seconds`` off."""
    return {
        "LD_PRELOAD": str(library),
        "FAKETIME": f"{seconds:+d}s",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


async def drift_of(port: int) -> float | None:
    """The drift a worker reports on its /metrics (None until its first refresh)."""
    async with httpx.AsyncClient(timeout=5) as client:
        text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
    found = DRIFT.search(text)
    return float(found.group(1)) if found else None


async def until_due(url: str, ids: list[UUID]) -> None:
    """Wait until every hold of ``ids`` is due by the database's clock.

    Before that, no work left (what ``settle`` waits for) does not mean the run is over:
    the holds that come due during it would still be held.
    """
    conn = await asyncpg.connect(url)
    try:
        async with asyncio.timeout(60):
            while await conn.fetchval(NOT_YET_DUE_SQL, ids):
                await asyncio.sleep(0.5)
    finally:
        await conn.close()


async def test_skewed_worker_clocks_neither_expire_early_nor_lose_a_hold(
    world: World, libfaketime: Path
) -> None:
    """A consumer 5 minutes ahead, one 5 minutes behind, a scanner 2 minutes ahead, over
    holds due now and holds that come due during the run: each expires once, none before
    its deadline by the database's clock; each worker reports its drift."""
    workload = await create_workload(world.database_url, holds_from_environment())
    soon = await insert_holds(world.database_url, 300, due_in=3.0, spread=6.0)
    workload.due += soon
    ports = {"ahead": free_port(), "behind": free_port()}
    consumers = [
        await world.consumer(
            name=f"consumer-{which}",
            EXPIRY_HTTP_PORT=str(ports[which]),
            **skewed(libfaketime, SKEWS[which]),
        )
        for which in ("ahead", "behind")
    ]
    await wait_for_consumers(world.amqp_url, 2)
    started = time.monotonic()
    scanner = await world.scanner(every=1.0, **skewed(libfaketime, SKEWS["scanner"]))
    drifts: dict[str, float] = {}

    async def reported() -> bool:
        for which, port in ports.items():
            if (value := await drift_of(port)) is None:
                return False
            drifts[which] = value
        return True

    async with asyncio.timeout(60):
        while not await reported():
            await asyncio.sleep(0.5)
    await until_due(world.database_url, soon)
    expect = workload.expectation(set())
    settled = await settle(world, expect, settle_timeout(workload.holds))
    seconds = time.monotonic() - started
    await stop_cleanly([scanner, *consumers])
    checked = await check_run(world, workload, Finished(expect, seconds, settled))
    conn = await asyncpg.connect(world.database_url)
    try:
        early = await conn.fetchval(EARLY_SQL)
    finally:
        await conn.close()
    assert early == 0
    assert abs(drifts["ahead"] - SKEWS["ahead"]) < 2, drifts
    assert abs(drifts["behind"] - SKEWS["behind"]) < 2, drifts
    checked.report(
        "14 skewed worker clocks",
        skews_s="/".join(f"{k}{v:+d}" for k, v in SKEWS.items()),
        reported_drift_s="/".join(f"{drifts[k]:+.2f}" for k in ("ahead", "behind")),
        came_due_during_run=len(soon),
        expired_before_deadline=early,
    )
