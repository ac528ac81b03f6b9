"""The relay's wake-ups: a dedicated, direct PostgreSQL connection that LISTENs.

The consumers NOTIFY ``expiry_events`` after a commit that wrote events (at most once
in ``EXPIRY_EVENTS_NOTIFY_MS``); each notification sets the relay's ``wake``, so that an
event is published within milliseconds of its commit. A LISTEN lives on its session:
it needs a connection of its own, straight to the server or through a pooler in
session mode (a transaction-pooling proxy, PgBouncer in transaction mode, hands the
session to others between statements and the notifications never arrive): DATABASE_URL,
or behind a transaction pooler EXPIRY_DB_SESSION_URL; without it the relay polls.

A listening connection only reads: one that died silently (a half-open TCP connection:
a server or a firewall that went away without a word) would never say so. So every
``CHECK_SECONDS`` it is asked ``SELECT 1``, which must answer within
``CHECK_TIMEOUT_SECONDS``; a connection that does not, or that asyncpg says was
terminated, is dropped and a new one made (``relay.listener_lost``, then
``relay.listening``), the relay's poll covering for it meanwhile. A new connection
wakes the relay once: what was notified while nobody listened is looked for at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from service.adapters import postgres
from service.adapters.classify import classify
from service.adapters.postgres.outbox import CHANNEL
from service.settings import Settings

log = logging.getLogger("service.relay")

CHECK_SECONDS = 5.0
CHECK_TIMEOUT_SECONDS = 5.0
# Between attempts to listen again: 1 s, twice as long each time, up to this.
RECONNECT_MAX_SECONDS = 30.0
APPLICATION_NAME = "expiry-relay-listen"


class Listener:
    """Keeps a LISTEN on ``CHANNEL`` open, and sets ``wake`` on each notification (see
    the module docstring); ``listening`` says whether it has one now."""

    def __init__(self, settings: Settings, wake: asyncio.Event) -> None:
        self.settings = settings
        self.wake = wake
        self.listening = False
        self.lost_at: float | None = None  # when the last connection was found dead

    async def run(self) -> None:
        """Listen, watch, listen again, until cancelled."""
        attempts = 0
        while True:
            conn: postgres.PlainConnection | None = None
            try:
                conn = await self._listen()
                attempts = 0
                await self._watch(conn)
            except Exception as exc:
                attempts += 1
                self._failed(exc, attempts)
            finally:
                self.listening = False
                if conn is not None:
                    conn.terminate()  # at once: a close would wait on a dead peer
            if self.lost_at is None:
                self.lost_at = time.monotonic()
            await asyncio.sleep(min(RECONNECT_MAX_SECONDS, 2.0 ** max(0, attempts - 1)))

    async def _listen(self) -> postgres.PlainConnection:
        """A new connection that LISTENs; the relay is woken once, for what it missed."""
        conn = await postgres.connect(self.settings, application_name=APPLICATION_NAME)
        try:
            await conn.add_listener(CHANNEL, self._notified)
        except BaseException:
            conn.terminate()
            raise
        self.listening = True
        facts: dict[str, Any] = {"channel": CHANNEL}
        if self.lost_at is not None:
            facts["deaf_seconds"] = round(time.monotonic() - self.lost_at, 3)
            self.lost_at = None
        log.info("relay.listening", extra=facts)
        self.wake.set()
        return conn

    def _notified(self, *_args: object) -> None:
        self.wake.set()

    async def _watch(self, conn: postgres.PlainConnection) -> None:
        """Return once the connection is found dead: terminated, or no answer in time."""
        terminated = asyncio.Event()
        conn.add_termination_listener(lambda _conn: terminated.set())
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CHECK_SECONDS):
                    await terminated.wait()
            if terminated.is_set() or conn.is_closed():
                self._lost("the connection was closed")
                return
            try:
                async with asyncio.timeout(CHECK_TIMEOUT_SECONDS):
                    await postgres.ping(conn)
            except TimeoutError:
                self._lost(f"no answer to SELECT 1 within {CHECK_TIMEOUT_SECONDS:g}s")
                return
            except Exception as exc:  # the connection broke under the check
                self._lost(f"SELECT 1 failed ({type(exc).__name__})")
                return

    def _lost(self, reason: str) -> None:
        self.lost_at = time.monotonic()
        log.warning(
            "relay.listener_lost",
            extra={"reason": reason, "covered_by": "the poll, until it listens again"},
        )

    def _failed(self, exc: Exception, attempts: int) -> None:
        """A connection that could not be made, or failed under the watch: said at the
        first failure of a run, then quietly until it listens again."""
        if self.lost_at is None:
            self.lost_at = time.monotonic()
        level = logging.WARNING if attempts == 1 else logging.DEBUG
        log.log(
            level,
            "relay.listen_failed",
            extra={"error_class": classify(exc)[1], "error": type(exc).__name__},
        )


def polling_only(settings: Settings) -> bool:
    """Whether the relay can have no LISTEN: DATABASE_URL goes through a transaction
    pooler and no EXPIRY_DB_SESSION_URL is given (said at start, ``relay.polling_only``)."""
    return postgres.session_settings(settings) is None


@contextlib.asynccontextmanager
async def listening(settings: Settings, wake: asyncio.Event) -> AsyncIterator[Listener]:
    """A ``Listener`` running for the block (stopped at its end), on a session of its own
    (``postgres.session_settings``); none when there can be none (``polling_only``)."""
    session = postgres.session_settings(settings)
    if session is None:
        log.warning(
            "relay.polling_only",
            extra={
                "reason": "DATABASE_URL goes through a transaction pooler "
                "(EXPIRY_DB_POOLER=transaction) and EXPIRY_DB_SESSION_URL is not set",
                "covered_by": f"the poll, every {settings.relay_poll_seconds:g}s",
            },
        )
        yield Listener(settings, wake)
        return
    listener = Listener(session, wake)
    task = asyncio.create_task(listener.run(), name="relay-listener")
    try:
        yield listener
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
