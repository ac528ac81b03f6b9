"""A scenario under load: consumers, a scanner on a timer, the support side, the end check."""

from __future__ import annotations

import asyncio
import random
import signal
import time
from dataclasses import dataclass, field
from uuid import UUID

import asyncpg

from tests.faults.checks import Expectation, settle, wait_for_consumers
from tests.faults.services import ServiceProcess
from tests.faults.workload import Workload, support_side
from tests.faults.world import World

PROGRESS_SQL = "SELECT count(*) FROM reservations WHERE status <> 'held' AND hold_until <= now()"


def settle_timeout(holds: int) -> float:
    """How long a scenario may take to finish its work, by size."""
    return 90.0 + holds / 150


@dataclass
class LoadRun:
    """Consumers and a scanner working through a workload while a scenario injects faults."""

    world: World
    workload: Workload
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    consumers: list[ServiceProcess] = field(default_factory=list)
    scanner: ServiceProcess | None = None
    support: asyncio.Task[set[UUID]] | None = None
    started: float = 0.0
    kills: int = 0
    consumer_env: dict[str, str] = field(default_factory=dict)

    async def start(self, consumers: int, scan_every: float = 1.0, others: int = 0) -> None:
        """Attach ``consumers`` (besides ``others`` started by the scenario), then start the
        support side and the scanner."""
        for _ in range(consumers):
            self.consumers.append(await self.world.consumer(**self.consumer_env))
        await wait_for_consumers(self.world.amqp_url, consumers + others)
        self.started = time.monotonic()
        candidates = self.workload.support_candidates(self.rng)
        self.support = asyncio.create_task(support_side(self.world.database_url, candidates))
        self.scanner = await self.world.scanner(every=scan_every)

    async def progress(self) -> float | None:
        """The share of due holds no longer held, or None if the database is away."""
        try:
            conn = await asyncpg.connect(self.world.database_url, timeout=5)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
            return None
        try:
            done: int = await conn.fetchval(PROGRESS_SQL)
        finally:
            await conn.close()
        return done / max(1, len(self.workload.due))

    async def reach(self, fraction: float) -> None:
        """Wait until ``fraction`` of the due holds are done."""
        async with asyncio.timeout(settle_timeout(self.workload.holds)):
            while (done := await self.progress()) is None or done < fraction:
                await asyncio.sleep(0.05)

    @property
    def live(self) -> list[ServiceProcess]:
        """The consumers that are still running."""
        return [c for c in self.consumers if c.alive]

    async def kill_one(self) -> ServiceProcess:
        """SIGKILL a random running consumer and start a replacement at once."""
        victim = self.rng.choice(self.live)
        code = await victim.stop(signal.SIGKILL, timeout=30)
        assert code == -signal.SIGKILL, f"{victim.name} exited {code}"
        self.kills += 1
        replacement = await self.world.consumer(**self.consumer_env)
        self.consumers.append(replacement)
        return replacement

    async def consumed(self) -> set[UUID]:
        """The holds the support side won (waits for it to finish)."""
        assert self.support is not None
        return await self.support

    async def finish(self, timeout: float | None = None) -> Finished:
        """Wait until all work is done (or ``timeout``), stop everything with SIGTERM
        (exit 0), and say what to expect."""
        expect = self.workload.expectation(await self.consumed())
        settled = await settle(self.world, expect, timeout or settle_timeout(self.workload.holds))
        seconds = time.monotonic() - self.started
        await started(self.live)  # a replacement SIGTERMed while importing exits -15
        await stop_cleanly([p for p in (self.scanner, *self.consumers) if p is not None])
        return Finished(expect, seconds, settled)


@dataclass(frozen=True)
class Finished:
    """How a run ended: what to expect, how long the work took, whether it settled."""

    expect: Expectation
    seconds: float
    settled: bool


async def started(consumers: list[ServiceProcess], timeout: float = 60.0) -> None:
    """Wait until each running consumer has said it started (or has exited)."""
    async with asyncio.timeout(timeout):
        while any(c.alive and not c.named("consumer.started") for c in consumers):
            await asyncio.sleep(0.1)


async def stop_cleanly(processes: list[ServiceProcess]) -> None:
    """SIGTERM every running process and require exit 0 (a clean drain)."""
    running = [p for p in processes if p.alive]
    for process in running:
        process.send(signal.SIGTERM)
    for process in running:
        code = await process.wait(60)
        assert code == 0, f"{process.name} exited {code} on SIGTERM:\n{process.text()[-2000:]}"
