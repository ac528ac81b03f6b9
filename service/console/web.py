"""What every console page is made with: the application's state (``Console``), who is
asking (the request's session, looked up once), a rendered page or a refusal, the
``logged_in`` guard, a POST's form checked against the session's CSRF token.

Every page needs an operator with an open session (``service/console/sessions.py``):
logged in with a password (``EXPIRY_CONSOLE_USERS``, scrypt hashes) or named by a
trusted reverse proxy (``EXPIRY_CONSOLE_TRUSTED_HEADER``). Every state-changing request
is a POST carrying the session's CSRF token. Pages show records as ``cell`` does (no
control characters), bodies only as their masked excerpt, and no credentials.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aio_pika.abc import AbstractRobustConnection
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.templating import Jinja2Templates

from service.adapters import amqp, postgres
from service.adapters.postgres import console as store
from service.console import auth, guard, sessions
from service.core import recorded_policy
from service.core.durations import human
from service.core.inputs import clean_text
from service.ops import dead_letters
from service.settings import OPERATOR_LIMIT, Settings

HERE = Path(__file__).resolve().parent
BROKER_RETRY_SECONDS = 10.0
# The acts only an operator of EXPIRY_REPLAY_OPERATORS may do, as a page names them.
GUARDED_ACTS = "replay, close or reopen"

templates = Jinja2Templates(directory=str(HERE / "templates"))
templates.env.filters["cell"] = dead_letters.cell
templates.env.filters["age"] = human
templates.env.filters["shown_operator"] = dead_letters.shown_operator
templates.env.globals["describe_policy"] = recorded_policy.describe


@dataclass
class Console:
    """What the application holds while it runs."""

    settings: Settings
    users: dict[str, str]
    sessions: sessions.Sessions
    pool: postgres.Pool | None = None
    broker: AbstractRobustConnection | None = None
    broker_tried: float = -BROKER_RETRY_SECONDS
    broker_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def connection(self) -> AbstractRobustConnection | None:
        """The broker connection, (re)opened at most every BROKER_RETRY_SECONDS."""
        async with self.broker_lock:
            loop = asyncio.get_running_loop()
            if self.broker is None and loop.time() - self.broker_tried >= BROKER_RETRY_SECONDS:
                self.broker_tried = loop.time()
                with contextlib.suppress(OSError, ConnectionError, TimeoutError):
                    self.broker = await amqp.connect(self.settings, name="expiry-console")
            return self.broker

    def may(self, operator: str, doing: str) -> str | None:
        """Why ``operator`` may not replay, close, reopen or end sessions (None: it may)."""
        if doing not in ("replay", "close", "reopen", "end sessions"):
            return None
        return dead_letters.refusal(self.settings, self.actor(operator, ""), doing)

    def may_not(self, operator: str | None) -> str | None:
        """Why ``operator`` is offered no replay, close or reopen (nor the sessions page),
        or None: the pages leave out what ``may`` would refuse, and say why."""
        if operator is None:
            return None
        return dead_letters.refusal(self.settings, self.actor(operator, ""), GUARDED_ACTS)

    def actor(self, operator: str, client: str) -> postgres.Actor:
        """Who acts: the operator, the console's OS user, the browser's address."""
        return postgres.Actor(
            clean_text(operator, OPERATOR_LIMIT),
            dead_letters.os_user(),
            clean_text(client, 100) or "-",
        )


def console_of(request: Request) -> Console:
    """The application's state."""
    console: Console = request.app.state.console
    return console


# -- who is asking ----------------------------------------------------------------------


_UNSEEN = object()


def client_of(request: Request) -> str:
    """The browser's address (the proxy's, behind one)."""
    return clean_text(request.client.host if request.client else "", 100) or "-"


def _proxied(request: Request) -> str | None:
    """The trusted proxy's name for the operator (None: no proxy, or no name)."""
    header = console_of(request).settings.console_trusted_header
    if not header:
        return None
    return clean_text(request.headers.get(header, "").strip(), OPERATOR_LIMIT) or None


async def session_of(request: Request) -> store.Session | None:
    """The request's open session, looked up once; behind a trusted proxy, one is begun
    for the proxy's operator when this browser has none."""
    seen = getattr(request.state, "session", _UNSEEN)
    if seen is not _UNSEEN:
        return seen if isinstance(seen, store.Session) else None
    console = console_of(request)
    assert console.pool is not None
    proxied = _proxied(request)
    async with console.pool.acquire() as conn:
        found = await console.sessions.current(
            conn, request.cookies.get(sessions.SESSION_COOKIE), proxied
        )
        if found is None and proxied is not None:
            found, token, _device = await console.sessions.begin(
                conn, proxied, client_of(request), None
            )
            request.state.new_token = token
    request.state.session = found
    return found


def operator_of(request: Request) -> str | None:
    """The operator of the request's session (once ``session_of`` found it), else None."""
    found = getattr(request.state, "session", None)
    return found.operator if isinstance(found, store.Session) else None


def page(request: Request, template: str, status: int = 200, **context: Any) -> Response:
    """A rendered page, with the operator, the CSRF token and why the operator is offered
    no replay, close or reopen (``may_not``: None when it is) in its context."""
    found = getattr(request.state, "session", None)
    context.setdefault("csrf", found.csrf if isinstance(found, store.Session) else "")
    operator = operator_of(request)
    context.update(operator=operator, may_not=console_of(request).may_not(operator))
    return templates.TemplateResponse(request, template, context, status_code=status)


def refused(request: Request, status: int, why: str) -> Response:
    """An error page (nothing else is said: no traceback, no echo of the request)."""
    return page(request, "error.html", status=status, why=why)


def set_cookie(
    response: Response, name: str, value: str, *, path: str = "/", max_age: int | None = None
) -> None:
    """One of the console's cookies: for this site's requests only, never read by a
    script (without ``max_age``, it lasts as long as the browser keeps it)."""
    response.set_cookie(name, value, max_age=max_age, httponly=True, samesite="strict", path=path)


def set_session_cookie(response: Response, token: str) -> None:
    """The session's cookie (the server ends the session itself)."""
    set_cookie(response, sessions.SESSION_COOKIE, token)


Handler = Callable[[Request, str], Awaitable[Response]]


def logged_in(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """Only for an operator with an open session: else the login page (GET) or 401."""

    async def guarded(request: Request) -> Response:
        found = await session_of(request)
        if found is None:
            if request.method == "GET":
                return RedirectResponse("/login", status_code=303)
            return refused(request, 401, "log in first")
        response = await handler(request, found.operator)
        if (token := getattr(request.state, "new_token", None)) is not None:
            set_session_cookie(response, token)
        return response

    return guarded


async def posted(request: Request) -> FormData | None:
    """The form of a POST whose CSRF token is the session's; None if it is not."""
    form = await request.form(max_files=0, max_fields=50, max_part_size=guard.PLAN_LIMIT)
    found = getattr(request.state, "session", None)
    expected = found.csrf if isinstance(found, store.Session) else None
    if not auth.csrf_matches(expected, form.get("csrf")):
        return None
    return form


def field_of(form: FormData, name: str, limit: int = 500) -> str:
    """A form field as text (bounded, no control characters)."""
    value = form.get(name)
    return clean_text(value.strip(), limit) if isinstance(value, str) else ""
