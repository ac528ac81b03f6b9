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

The first LISTEN is made at start: a TLS refusal there stops the relay with one line
naming the setting (DATABASE_URL or EXPIRY_DB_SESSION_URL), since only a setting can
mend it; a server that is down is left to the retries, the poll covering meanwhile.
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
from service.core.tls_failures import TlsRefused
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

    def __init__(
        self, settings: Settings, wake: asyncio.Event, *, setting: str = "DATABASE_URL"
    ) -> None:
        self.settings = settings
        self.wake = wake
        self.setting = setting  # the setting whose URL ``settings.database_url`` is
        self.listening = False
        self.lost_at: float | None = None  # when the last connection was found dead

    async def first(self) -> postgres.PlainConnection | None:
        """The LISTEN made at start. A TLS refusal stops the relay there (``TlsRefused``,
        one line naming the setting: no retry can help); any other failure is said and
        left to ``run`` (None), the poll covering meanwhile."""
        try:
            return await self._listen()
        except TlsRefused:
            raise
        except Exception as exc:
            self._failed(exc, 1)
            return None

    async def run(self, first: postgres.PlainConnection | None) -> None:
        """Watch ``first`` (None: it failed, see ``first``), then listen, watch, listen
        again, until cancelled."""
        attempts = 0 if first is not None else 1
        if first is None:
            await asyncio.sleep(1.0)
        while True:
            conn, first = first, None
            try:
                if conn is None:
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
        conn = await postgres.connect(
            self.settings, application_name=APPLICATION_NAME, setting=self.setting
        )
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
    found = postgres.session_settings(settings)
    if found is None:
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
    session, setting = found
    listener = Listener(session, wake, setting=setting)
    first = await listener.first()
    task = asyncio.create_task(listener.run(first), name="relay-listener")
    try:
        yield listener
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
