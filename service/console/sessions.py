"""The console's sessions, kept in PostgreSQL, and its throttled, audited logins.

Three cookies, each ``HttpOnly`` and ``SameSite=Strict``:

- ``expiry_console``: a session's random token (the database keeps its SHA-256 only).
  A request finds its session while it is open: not ended (log out, ``end-sessions``,
  the sessions page), seen within ``EXPIRY_CONSOLE_SESSION_IDLE_SECONDS``, begun within
  ``EXPIRY_CONSOLE_SESSION_MAX_SECONDS``, and begun with the password hash the operator
  has now (a changed password, or an operator removed from ``EXPIRY_CONSOLE_USERS``,
  ends it at its next request).
- ``expiry_console_login``: the login form's CSRF cookie; the form carries its HMAC
  under the console's key (a double-submit token no other site can forge).
- ``expiry_console_device``: set at each successful login, kept 90 days: a browser that
  shows it is throttled apart from everyone else trying that name
  (``service/core/login_throttle.py``).

Logins for one name or from one address are checked one at a time in this process (a
burst of parallel guesses is weighed guess by guess), and every one is appended to
``console_logins``: ok, failed, or refused by the throttle before any password check.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from service.adapters import postgres
from service.adapters.postgres import console as store
from service.console import auth
from service.core import login_throttle
from service.settings import Settings

log = logging.getLogger("service.console")

SESSION_COOKIE = "expiry_console"
LOGIN_COOKIE = "expiry_console_login"
DEVICE_COOKIE = "expiry_console_device"
DEVICE_SECONDS = 90 * 86400
PROXY_CREDENTIAL = "proxy"
COOKIE_LIMIT = 200  # a cookie value longer than any we set is nobody's
STRIPES = 64


def digest(token: str) -> bytes:
    """What the database keeps of a cookie's token."""
    return hashlib.sha256(token.encode()).digest()


def credential_of(hashed: str | None) -> str:
    """A fingerprint of an operator's password hash (``proxy`` for a proxy's operator):
    a session begun under another one has ended."""
    if hashed is None:
        return PROXY_CREDENTIAL
    return hashlib.sha256(hashed.encode()).hexdigest()[:32]


def cookie(value: str | None) -> str | None:
    """A cookie's value if it could be one of ours."""
    if not value or len(value) > COOKIE_LIMIT or not value.isascii():
        return None
    return value


@dataclass
class Gate:
    """One login at a time per name and per address (striped locks: bounded memory
    whatever names an attacker makes up)."""

    locks: list[asyncio.Lock] = field(
        default_factory=lambda: [asyncio.Lock() for _ in range(STRIPES)]
    )

    @contextlib.asynccontextmanager
    async def hold(self, name: str, client: str) -> AsyncIterator[None]:
        """Hold the stripes of ``name`` and ``client`` (always in the same order)."""
        stripes = sorted({hash(("name", name)) % STRIPES, hash(("client", client)) % STRIPES})
        async with contextlib.AsyncExitStack() as stack:
            for stripe in stripes:
                await stack.enter_async_context(self.locks[stripe])
            yield


@dataclass(frozen=True)
class Login:
    """What a login got: ``ok`` (with the new session's cookies), ``failed`` or
    ``refused`` (with the throttle's message and wait)."""

    outcome: str
    message: str = ""
    wait_seconds: float = 0.0
    token: str = ""
    device: str = ""


@dataclass
class Sessions:
    """The console's sessions and logins, under its settings."""

    settings: Settings
    users: dict[str, str]
    key: bytes
    gate: Gate = field(default_factory=Gate)

    @property
    def policy(self) -> login_throttle.Policy:
        s = self.settings
        return login_throttle.Policy(s.console_login_attempts, s.console_login_lock_seconds)

    # -- the login form's CSRF ------------------------------------------------------

    def login_token(self, login_cookie: str) -> str:
        """The login form's token for this browser's login cookie."""
        return hmac.new(self.key, login_cookie.encode(), hashlib.sha256).hexdigest()

    def login_form_ok(self, login_cookie: str | None, given: object) -> bool:
        """Whether a login form's token belongs to this browser's login cookie."""
        value = cookie(login_cookie)
        return value is not None and auth.csrf_matches(self.login_token(value), given)

    # -- a request's session --------------------------------------------------------

    async def current(
        self, conn: postgres.Connection, token: str | None, proxied: str | None
    ) -> store.Session | None:
        """The open session of this cookie, if its operator may still use it; a session
        whose operator's password changed (or who is no longer an operator) is ended."""
        value = cookie(token)
        if value is None:
            return None
        s = self.settings
        found = await store.touch_session(
            conn, digest(value), s.console_session_idle_seconds, s.console_session_max_seconds
        )
        if found is None:
            return None
        if s.console_trusted_header:
            return found if proxied == found.operator else None
        why = self._ended_why(found)
        if why is not None:
            await store.end_session(conn, digest(value), "console", why)
            log.info("console.session_ended", extra={"operator": found.operator, "reason": why})
            return None
        return found

    def _ended_why(self, session: store.Session) -> str | None:
        hashed = self.users.get(session.operator)
        if hashed is None:
            return "no longer an operator"
        if credential_of(hashed) != session.credential:
            return "password changed"
        return None

    async def begin(
        self, conn: postgres.Connection, operator: str, client: str, replacing: str | None
    ) -> tuple[store.Session, str, str]:
        """A new session for ``operator`` (ending the one this browser had), its cookie's
        token and a new device token."""
        if (old := cookie(replacing)) is not None:
            await store.end_session(conn, digest(old), operator, "replaced by a new login")
        token, device = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        hashed = None if self.settings.console_trusted_header else self.users.get(operator)
        session = await store.start_session(
            conn,
            digest(token),
            operator,
            credential_of(hashed),
            auth.new_csrf_token(),
            digest(device),
            client,
        )
        return session, token, device

    async def end(self, conn: postgres.Connection, token: str | None, by: str) -> None:
        """Log out: end this cookie's session."""
        if (value := cookie(token)) is not None:
            await store.end_session(conn, digest(value), by, "logged out")

    # -- logging in -----------------------------------------------------------------

    async def log_in(
        self,
        pool: postgres.Pool,
        name: str,
        password: str,
        client: str,
        device_cookie: str | None,
    ) -> Login:
        """Weigh the recent attempts, check the password unless the throttle refuses,
        audit the attempt; one at a time per name and per address."""
        known = name in self.users
        async with self.gate.hold(name, client):
            async with pool.acquire() as conn:
                device = await self._known_device(conn, name, device_cookie)
                now, recent = await store.recent_logins(
                    conn, name, client, self.policy.lock_seconds
                )
                trial = login_throttle.Trial(name, client, device)
                verdict = login_throttle.decide(self.policy, trial, recent, now)
                if not verdict.allowed:
                    await store.record_login(
                        conn, name, known=known, client=client, device=device,
                        outcome="refused", detail=verdict.why,
                    )  # fmt: skip
                    log.warning("console.login_refused", extra={"operator": name})
                    return Login("refused", verdict.message(), verdict.wait_seconds)
            matched = await asyncio.to_thread(auth.authenticate, self.users, name, password)
            async with pool.acquire() as conn:
                outcome = "ok" if matched else "failed"
                await store.record_login(
                    conn, name, known=known, client=client, device=device, outcome=outcome
                )
        if not matched:
            log.warning("console.login_failed", extra={"operator": name})
            return Login("failed", "Wrong name or password.")
        log.info("console.login", extra={"operator": name})
        return Login("ok")

    async def _known_device(
        self, conn: postgres.Connection, name: str, device_cookie: str | None
    ) -> bool:
        value = cookie(device_cookie)
        if value is None or name not in self.users:
            return False
        return await store.known_device(conn, digest(value), name, DEVICE_SECONDS)
