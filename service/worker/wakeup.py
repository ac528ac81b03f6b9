"""Waking the relays after a commit that wrote events, at most once in a while.

An expiry writes its event in its own transaction (the trigger of migration
``0014_events``); the relays LISTEN on ``expiry_events`` so as to publish it within
milliseconds rather than at their next poll. A ``NOTIFY`` inside the expiry's
transaction would make every expiring commit queue on the one lock PostgreSQL takes,
cluster-wide, to commit a notification (reported at 1,000 notifying commits a second:
p99 commit 1.2 s, against 6.5 ms without). So the consumer notifies **after** the
commit, from a task of its own, and **coalesced**: at most one ``NOTIFY`` in each
``EXPIRY_EVENTS_NOTIFY_MS`` window, whatever the number of commits in it.

The first commit after a quiet window is notified at once; those that follow within the
window share one more notification at its end. A ``NOTIFY`` that fails is logged once
(until one succeeds again) and never fails a delivery: the relays' poll covers it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from opentelemetry.instrumentation.utils import suppress_instrumentation

from service.adapters import postgres
from service.adapters.classify import classify
from service.adapters.postgres import outbox

log = logging.getLogger("service.consume")

# On a stop, how long the last notification may take before it is given up.
CLOSE_TIMEOUT_SECONDS = 2.0


class Waker(Protocol):
    """What the store tells after a commit that wrote events."""

    def written(self) -> None:
        """A commit wrote events: wake the relays soon (never inside that commit)."""
        ...

    async def close(self) -> None:
        """Send what is owed, briefly; then stop."""
        ...


class Silent:
    """Wakes nobody (the relays' poll finds the events): for a store without relays to
    wake, and the tests of other parts."""

    def written(self) -> None:
        return None

    async def close(self) -> None:
        return None


SILENT = Silent()


class Wakeup:
    """Sends ``notify`` after commits that wrote events, at most once per ``window_ms``.

    ``clock`` and ``sleep`` are the event loop's unless a test gives its own.
    """

    def __init__(
        self,
        notify: Callable[[], Awaitable[None]],
        *,
        window_ms: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._notify = notify
        self._window = window_ms / 1000
        self._clock = clock
        self._sleep = sleep
        self._owed = False  # a commit wrote events since the last notification began
        self._last = float("-inf")  # when the last notification began
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        self.sent = 0  # notifications that went out

    @property
    def idle(self) -> bool:
        """Nothing owed, nothing under way."""
        return self._task is None

    def written(self) -> None:
        self._owed = True
        if self._task is None:  # in a context of its own: no delivery's trace
            loop = asyncio.get_running_loop()
            self._task = loop.create_task(self._send_owed(), context=contextvars.Context())

    async def close(self) -> None:
        task = self._task
        if task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), CLOSE_TIMEOUT_SECONDS)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _send_owed(self) -> None:
        """Notify while commits are owed one, each at least a window after the last."""
        try:
            while self._owed:
                wait = self._last + self._window - self._clock()
                if wait > 0:
                    await self._sleep(wait)
                self._owed = False
                self._last = self._clock()
                await self._send()
        finally:
            self._task = None

    async def _send(self) -> None:
        try:
            await self._notify()
        except Exception as exc:  # the relays' poll covers a lost wake-up
            if not self._failing:
                log.warning("events.notify_failed", extra={"error_class": classify(exc)[1]})
            self._failing = True
            return
        if self._failing:
            log.info("events.notify_recovered")
        self._failing = False
        self.sent += 1


def pooled_notify(pool: postgres.Pool, *, timeout: float) -> Callable[[], Awaitable[None]]:
    """``NOTIFY expiry_events`` on a connection of ``pool`` (waiting for one at most
    ``timeout`` seconds), in a transaction of its own; no span for it."""

    async def notify() -> None:
        with suppress_instrumentation():
            async with pool.acquire(timeout=timeout) as conn:
                await outbox.notify(conn)

    return notify


def wakeup_for(pool: postgres.Pool, *, window_ms: int, timeout: float) -> Wakeup:
    """The consumer's: notifications on its own pool."""
    return Wakeup(pooled_notify(pool, timeout=timeout), window_ms=window_ms)
