"""Watching a run: the holds and the queues, a live line until every hold has ended."""

from __future__ import annotations

import asyncio
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

from service.adapters import postgres
from service.adapters.amqp.queues import QueueProbe
from service.adapters.postgres import demo as demo_sql
from service.core.topology import DEAD_QUEUE, QUEUE, Topology


@dataclass(frozen=True)
class Snapshot:
    """One look at the holds and the queues."""

    held: int
    expired: int
    consumed: int
    due: int
    oldest_due: float
    queued: int
    retrying: int
    dead: int

    @property
    def settled(self) -> bool:
        return self.held == 0 and self.queued == 0 and self.retrying == 0


class Queues:
    """The sandbox's queues as the demo shows them (a queue not declared yet counts 0)."""

    def __init__(self, probe: QueueProbe, topology: Topology) -> None:
        self.probe = probe
        self.retry_queues = [spec.name for spec in topology.delay_queues]

    async def ready(self, name: str) -> int:
        """Ready messages in queue ``name``."""
        return await self.probe.ready(name)

    async def consumers(self) -> int:
        """Consumers of the work queue."""
        return await self.probe.consumers(QUEUE)

    async def retrying(self) -> int:
        """Ready messages in every delay queue."""
        return sum([await self.probe.ready(name) for name in self.retry_queues])


async def snapshot(conn: postgres.Connection, queues: Queues) -> Snapshot:
    """The state of the holds and the queues right now."""
    row = await demo_sql.progress(conn)
    return Snapshot(
        held=row["held"],
        expired=row["expired"],
        consumed=row["consumed"],
        due=row["due"],
        oldest_due=row["oldest_due"],
        queued=await queues.ready(QUEUE),
        retrying=await queues.retrying(),
        dead=await queues.ready(DEAD_QUEUE),
    )


class Progress:
    """A live line on a terminal; a line a second otherwise."""

    def __init__(self, total: int, out: IO[str]) -> None:
        self.total = total
        self.out = out
        self.tty = out.isatty()
        self.tick = 0.25 if self.tty else 1.0

    def show(self, snap: Snapshot, elapsed: float) -> None:
        """Redraw the line (a terminal) or write one more (elsewhere)."""
        facts = (
            f"held {snap.held:>5} (due {snap.due:>4}, oldest due {snap.oldest_due:4.1f}s)  "
            f"expired {snap.expired:>5}  consumed {snap.consumed:>4}  "
            f"retrying {snap.retrying}  dead {snap.dead}  queued {snap.queued:>4}"
        )
        if self.tty:
            done = (self.total - snap.held) / max(1, self.total)
            bar = "#" * round(done * 20)
            line = f"  [{bar:<20}] {done:4.0%} {elapsed:5.1f}s  {facts}"
            width = shutil.get_terminal_size().columns - 1  # a wrapped line would not redraw
            self.out.write(f"\r{line[:width]}\x1b[K")
        else:
            self.out.write(f"  {elapsed:5.1f}s  {facts}\n")
        self.out.flush()

    def finish(self) -> None:
        """End the live line."""
        if self.tty:
            self.out.write("\n")
            self.out.flush()


async def watch(
    conn: postgres.Connection,
    queues: Queues,
    done: Callable[[], bool],
    give_up: Callable[[], bool],
) -> bool:
    """Show progress until ``done()`` and every hold ended and the queues are empty (True),
    or until ``give_up()`` (False)."""
    total = await demo_sql.count_reservations(conn)
    progress = Progress(total, sys.stdout)
    started = time.monotonic()
    try:
        while True:
            snap = await snapshot(conn, queues)
            progress.show(snap, time.monotonic() - started)
            if done() and snap.settled:
                return True
            if give_up():
                return False
            await asyncio.sleep(progress.tick)
    finally:
        progress.finish()
