"""Deliveries being handled, so that shutdown can wait for them (or give them back)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


class InFlight:
    """Deliveries being handled, so that shutdown can wait for them.

    A delivery is handled in a task of its own (``track``) or, batched, without
    one: it is counted from ``begin`` to ``end``.
    """

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()
        self.open = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def track(self, task: asyncio.Task[Any] | None = None) -> None:
        """Register ``task`` (default: the current one) until it finishes."""
        task = task or asyncio.current_task()
        if task is not None:
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def begin(self) -> None:
        """A delivery without a task of its own is now handled."""
        self.open += 1
        self._idle.clear()

    def end(self) -> None:
        """...and is now settled (or left to redelivery)."""
        self.open -= 1
        if self.open <= 0:
            self.open = 0
            self._idle.set()

    def __len__(self) -> int:
        return len(self.tasks) + self.open

    async def drain(self, timeout: float) -> int:
        """Wait for them; past ``timeout`` cancel the rest (unacked, so redelivered).

        Returns how many were abandoned.
        """
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while self.tasks or self.open:
                    if self.tasks:
                        await asyncio.wait(set(self.tasks))
                    if self.open:
                        await self._idle.wait()
        pending = set(self.tasks)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        return len(pending) + self.open
