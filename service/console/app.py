"""The console's web application (Starlette, server-rendered, no JavaScript).

Every page needs a logged-in operator (``EXPIRY_CONSOLE_USERS``, scrypt hashes)
or the name a trusted reverse proxy sets (``EXPIRY_CONSOLE_TRUSTED_HEADER``).
Every state-changing request is a POST carrying the session's CSRF token.
Replaying, closing and reopening need an operator named in
``EXPIRY_REPLAY_OPERATORS``, as on the command line; assigning and noting need
any operator; each act is audited with the operator's name, the database user
(set by the database), the console's OS user and the browser's address. Pages
show records as ``cell`` does (no control characters), bodies only as their
masked excerpt, and no credentials.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import logging
import math
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from aio_pika.abc import AbstractRobustConnection
from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp

from service.adapters import amqp, classify, lifecycle, postgres
from service.adapters.postgres import console as store
from service.console import auth, guard, pages, sessions
from service.core import recorded_policy
from service.core.durations import human
from service.core.errors import UsageError
from service.core.inputs import clean_text
from service.ops import dead_letters, dead_queue, plans, replay
from service.settings import OPERATOR_LIMIT, Settings

log = logging.getLogger("service.console")

HERE = Path(__file__).resolve().parent
POOL_SIZE = 4
LOGIN_FAILURE_PAUSE_SECONDS = 0.5
BROKER_RETRY_SECONDS = 10.0
ACTS = ("assign", "note", "close", "reopen")

templates = Jinja2Templates(directory=str(HERE / "templates"))
templates.env.filters["cell"] = dead_letters.cell
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

    def actor(self, operator: str, client: str) -> postgres.Actor:
        """Who acts: the operator, the console's OS user, the browser's address."""
        return postgres.Actor(
            clean_text(operator, OPERATOR_LIMIT), _os_user(), clean_text(client, 100) or "-"
        )


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


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
    """A rendered page, with the operator and the CSRF token in its context."""
    found = getattr(request.state, "session", None)
    context.setdefault("csrf", found.csrf if isinstance(found, store.Session) else "")
    context.update(operator=operator_of(request))
    return templates.TemplateResponse(request, template, context, status_code=status)


def refused(request: Request, status: int, why: str) -> Response:
    """An error page (nothing else is said: no traceback, no echo of the request)."""
    return page(request, "error.html", status=status, why=why)


def set_session_cookie(response: Response, token: str) -> None:
    """The session's cookie: for this site's requests only, never read by a script; it
    lasts as long as the browser keeps it, the server ends the session itself."""
    response.set_cookie(sessions.SESSION_COOKIE, token, httponly=True, samesite="strict", path="/")


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


# -- pages ----------------------------------------------------------------------------


async def login_page(request: Request) -> Response:
    """The login form (a trusted proxy's operators are never asked)."""
    if console_of(request).settings.console_trusted_header:
        return RedirectResponse("/", status_code=303)
    return _login_form(request)


def _login_form(request: Request, status: int = 200, **context: Any) -> Response:
    """The login form, its CSRF token bound to this browser's login cookie."""
    console = console_of(request)
    login_cookie = sessions.cookie(request.cookies.get(sessions.LOGIN_COOKIE))
    fresh = login_cookie is None
    login_cookie = login_cookie or secrets.token_urlsafe(32)
    token = console.sessions.login_token(login_cookie)
    response = page(request, "login.html", status=status, csrf=token, **context)
    if fresh:
        response.set_cookie(
            sessions.LOGIN_COOKIE, login_cookie, httponly=True, samesite="strict", path="/login"
        )
    return response


async def login(request: Request) -> Response:
    """Check the name and password (throttled, audited); begin the operator's session."""
    console = console_of(request)
    if console.settings.console_trusted_header:
        return RedirectResponse("/", status_code=303)
    form = await request.form(max_files=0, max_fields=10)
    if not console.sessions.login_form_ok(
        request.cookies.get(sessions.LOGIN_COOKIE), form.get("csrf")
    ):
        return refused(request, 403, "the form expired: reload the login page")
    name, password = field_of(form, "name", OPERATOR_LIMIT), form.get("password")
    secret = password if isinstance(password, str) else ""
    client = client_of(request)
    assert console.pool is not None
    tried = await console.sessions.log_in(
        console.pool, name, secret, client, request.cookies.get(sessions.DEVICE_COOKIE)
    )
    if tried.outcome == "refused":
        answer = _login_form(request, status=429, refused=tried.message)
        answer.headers["retry-after"] = str(max(1, math.ceil(tried.wait_seconds)))
        return answer
    if tried.outcome != "ok":
        await asyncio.sleep(LOGIN_FAILURE_PAUSE_SECONDS)
        return _login_form(request, status=401, failed=True)
    async with console.pool.acquire() as conn:
        _session, token, device = await console.sessions.begin(
            conn, name, client, request.cookies.get(sessions.SESSION_COOKIE)
        )
    response = RedirectResponse("/", status_code=303)
    set_session_cookie(response, token)
    response.set_cookie(
        sessions.DEVICE_COOKIE,
        device,
        max_age=sessions.DEVICE_SECONDS,
        httponly=True,
        samesite="strict",
        path="/login",
    )
    return response


@logged_in
async def logout(request: Request, operator: str) -> Response:
    """End the session at once."""
    if await posted(request) is None:
        return refused(request, 403, "the form expired")
    console = console_of(request)
    assert console.pool is not None
    async with console.pool.acquire() as conn:
        await console.sessions.end(conn, request.cookies.get(sessions.SESSION_COOKIE), operator)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(sessions.SESSION_COOKIE, path="/")
    return response


@logged_in
async def overview(request: Request, operator: str) -> Response:
    """Is anything stuck, and where."""
    console = console_of(request)
    broker = await console.connection()
    assert console.pool is not None
    seen = await pages.read_overview(console.pool, console.settings, broker)
    logins = await pages.read_login_failures(console.pool)
    return page(request, "overview.html", seen=seen, screen=seen.status, logins=logins)


@logged_in
async def listing(request: Request, operator: str) -> Response:
    """Dead letters: the groups, and a page of them, newest first."""
    query = pages.Query.parse(dict(request.query_params))
    console = console_of(request)
    assert console.pool is not None
    async with console.pool.acquire() as conn:
        found = await pages.read_listing(conn, query)
    return page(request, "dead_letters.html", listing=found, ages=pages.AGES)


@logged_in
async def detail(request: Request, operator: str) -> Response:
    """One dead letter: its record, the hold's audit trail, its replays and its events."""
    console = console_of(request)
    assert console.pool is not None
    async with console.pool.acquire() as conn:
        found = await dead_letters.read_detail(
            conn, request.path_params["key"][:300], console.settings
        )
        if found is None:
            return refused(request, 404, "no such dead letter")
        replayed = found.record["status"] == "replayed"
        expect = None if replayed else await dead_letters.expectation(conn, found.record)
    return page(request, "detail.html", detail=found, record=found.record, expect=expect)


def _selection(form: FormData) -> plans.Selection:
    """One dead letter (``key``), or a group chosen explicitly (``scope=group``: its error
    class, give-up reason and status, each blank for any); anything else selects nothing
    (``UsageError``)."""
    key = field_of(form, "key", plans.KEY_LIMIT)
    if field_of(form, "scope", 10) == "group":
        group = plans.Group(
            field_of(form, "error_class", plans.NAME_LIMIT) or None,
            field_of(form, "give_up", plans.NAME_LIMIT) or None,
            field_of(form, "status", 10) or None,
        )
        return plans.Selection(keys=(key,) if key else (), group=group)
    return plans.Selection(keys=(key,) if key else ())


def _plan_of(form: FormData, act: str, selection: plans.Selection) -> plans.Plan:
    """The plan a confirm form carries back (untrusted: ``plans.confirm`` checks it all)."""
    items = plans.parse_items(field_of(form, "plan", guard.PLAN_LIMIT))
    if not items:
        raise UsageError("the confirmation carries no plan: dry-run again")
    return plans.Plan(act, selection, items)


def _back(selection: plans.Selection) -> str:
    return (
        f"/dead-letters/{quote(selection.keys[0], safe='')}" if selection.keys else "/dead-letters"
    )


@logged_in
async def act(request: Request, operator: str) -> Response:
    """Assign, note, close or reopen one dead letter at once, or a group once its list was
    shown and confirmed (exactly the listed ones); each act audited."""
    console = console_of(request)
    form = await posted(request)
    if form is None:
        return refused(request, 403, "the form expired: reload the page")
    action = field_of(form, "action", 20)
    if action not in ACTS:
        return refused(request, 400, "no such act")
    if (why := console.may(operator, action)) is not None:
        return refused(request, 403, why)
    actor = console.actor(operator, request.client.host if request.client else "")
    text = field_of(form, "text")
    assert console.pool is not None
    async with console.pool.acquire() as conn:
        try:
            selection = _selection(form)
            if selection.group is not None and field_of(form, "step", 20) != "confirm":
                planned, rows = await plans.plan(conn, action, selection)
                lines = plans.plan_lines(planned, rows)
                return _plan_page(request, action, selection, planned, lines, text=text)
            if selection.group is not None:
                planned = _plan_of(form, action, selection)
            else:
                planned, _rows = await plans.plan(conn, action, selection)
            confirmed = await plans.confirm(conn, planned)
            results = await dead_letters.act(
                conn, console.settings, actor, confirmed.rows, action, text
            )
        except UsageError as exc:
            return refused(request, 400, str(exc))
        lines = dead_letters.act_lines(results, action) + confirmed.lines()
        if action == "close":
            keys = {r.message_id for r in results if r.outcome == "closed"}
            broker = await console.connection() if keys else None
            lines.append(await dead_queue.remove_copies(console.settings, conn, broker, keys))
    shown = [line for line in lines if line]
    return page(request, "result.html", title=action, lines=shown, back=_back(selection))


def _plan_page(
    request: Request,
    act: str,
    selection: plans.Selection,
    planned: plans.Plan,
    lines: list[str],
    *,
    text: str = "",
) -> Response:
    """The dry run, with a form that confirms exactly its plan."""
    return page(
        request,
        "plan.html",
        act=act,
        lines=lines,
        selection=selection,
        group=selection.group,
        token=planned.token(),
        count=len(planned.items),
        action="/replay" if act == "replay" else "/act",
        text=text,
    )


@logged_in
async def replay_selected(request: Request, operator: str) -> Response:
    """Replay one dead letter or a group: first the dry run, then, confirmed, the replay of
    exactly what it listed (the command line's code: republished with confirms, audited);
    the dead letters left out, and the group's newcomers, are named."""
    console = console_of(request)
    form = await posted(request)
    if form is None:
        return refused(request, 403, "the form expired: reload the page")
    actor = console.actor(operator, request.client.host if request.client else "")
    assert console.pool is not None
    async with console.pool.acquire() as conn:
        try:
            selection = _selection(form)
            if field_of(form, "step", 20) != "confirm":
                planned, rows = await plans.plan(conn, "replay", selection)
                shown = replay.dry_run(
                    rows, await dead_letters.expectations(conn, rows, console.settings)
                )
                lines = replay.report_lines(shown, dry_run=True) + plans.tail_lines(planned)
                return _plan_page(request, "replay", selection, planned, lines)
            if (why := console.may(operator, "replay")) is not None:
                await _audit_refusal(
                    conn, actor, await plans.select(conn, "replay", selection), why
                )
                return refused(request, 403, why)
            planned = _plan_of(form, "replay", selection)
        except UsageError as exc:
            return refused(request, 400, str(exc))
        confirmed = await plans.confirm(conn, planned)
        expectations = await dead_letters.expectations(conn, confirmed.rows, console.settings)
        try:
            results = await _replay(console, conn, confirmed.rows, actor, expectations)
        except UsageError as exc:  # another walk of the dead queue held it too long
            return refused(request, 409, str(exc))
    if results is None:
        return refused(request, 503, "RabbitMQ cannot be reached: nothing was replayed")
    lines = replay.report_lines(results, dry_run=False) + confirmed.lines()
    return page(request, "result.html", title="replay", lines=lines, back=_back(selection))


async def _audit_refusal(
    conn: postgres.Connection, actor: postgres.Actor, rows: list[Any], why: str
) -> None:
    with contextlib.suppress(UsageError):
        await dead_letters.refuse(conn, actor, rows, why)


async def _replay(
    console: Console,
    conn: postgres.Connection,
    rows: list[Any],
    actor: postgres.Actor,
    expectations: dict[int, str],
) -> list[replay.ReplayResult] | None:
    try:
        async with lifecycle.broker(console.settings, name=f"expiry-console {actor.operator}") as c:
            return await replay.replay(console.settings, conn, c, rows, actor, expectations)
    except (OSError, ConnectionError, TimeoutError):
        return None


# -- sessions ------------------------------------------------------------------------


@logged_in
async def sessions_page(request: Request, operator: str) -> Response:
    """The open sessions, for an operator who may end them (one of EXPIRY_REPLAY_OPERATORS)."""
    console = console_of(request)
    if (why := console.may(operator, "end sessions")) is not None:
        return refused(request, 403, why)
    assert console.pool is not None
    s = console.settings
    async with console.pool.acquire() as conn:
        rows = await store.open_sessions(
            conn, s.console_session_idle_seconds, s.console_session_max_seconds
        )
    mine = request.state.session.id
    shown = [pages.session_row(row, mine) for row in rows]
    return page(
        request,
        "sessions.html",
        sessions=shown,
        idle=human(s.console_session_idle_seconds),
        longest=human(s.console_session_max_seconds),
    )


@logged_in
async def end_sessions(request: Request, operator: str) -> Response:
    """End one session (``session``: its number) or every session of an operator
    (``operator``), as an operator who may; each one ended says by whom."""
    console = console_of(request)
    form = await posted(request)
    if form is None:
        return refused(request, 403, "the form expired: reload the page")
    if (why := console.may(operator, "end sessions")) is not None:
        return refused(request, 403, why)
    whose = field_of(form, "operator", OPERATOR_LIMIT)
    number = field_of(form, "session", 20)
    if not whose and not number.isdigit():
        return refused(request, 400, "nothing selected: name an operator or a session")
    assert console.pool is not None
    async with console.pool.acquire() as conn:
        ended = await store.end_sessions(
            conn,
            [whose] if whose else [],
            [int(number)] if number.isdigit() else [],
            operator,
            f"ended by {operator} on the sessions page",
        )
    log.warning("console.sessions_ended", extra={"operator": operator, "count": len(ended)})
    lines = [f"ended session {row['id']} of {row['operator']}" for row in ended]
    lines.append(f"{len(ended)} session(s) ended" if ended else "no open session matched")
    return page(request, "result.html", title="end sessions", lines=lines, back="/sessions")


# -- the application --------------------------------------------------------------------


ERROR_TITLES = {404: "Not found", 405: "Not allowed"}


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's 404 and 405 as a plain page."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    code, body = guard.plain_page(
        status, ERROR_TITLES.get(status, "Not done"), "there is nothing here"
    )
    return HTMLResponse(body, status_code=code)


async def server_error(request: Request, exc: Exception) -> Response:
    """Anything unexpected: a plain page (the log has the details, never the page): 503
    when the database is not migrated or cannot be reached (sessions live there), else
    500."""
    if classify.schema_missing(exc) is not None:
        status, why = 503, "the database is not migrated: run python -m service.migrate"
    elif isinstance(exc, classify.DATABASE_ERRORS):
        status, why = 503, "PostgreSQL cannot be reached (the console keeps its sessions there)"
    else:
        status, why = 500, "the console could not answer: the log says why"
    log.error("console.error", exc_info=exc, extra={"path": request.url.path[:200]})
    code, body = guard.plain_page(status, "Not available", why)
    return HTMLResponse(body, status_code=code)


class GuardedStarlette(Starlette):
    """Starlette with ``guard.Guard`` outside everything, its error handling included."""

    def build_middleware_stack(self) -> ASGIApp:
        return guard.Guard(super().build_middleware_stack())


def create_app(settings: Settings) -> Starlette:
    """The console for these settings (its database pool opens with the application)."""
    users = auth.users_from(settings.console_users)
    secret = settings.console_secret
    key = secret.get_secret_value() if secret is not None else secrets.token_urlsafe(48)
    console = Console(settings, users, sessions.Sessions(settings, users, key.encode()))

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        async with lifecycle.database_pool(settings, name="expiry-console", size=POOL_SIZE) as pool:
            console.pool = pool
            try:
                yield
            finally:
                if console.broker is not None:
                    await console.broker.close()

    app = GuardedStarlette(
        routes=[
            Route("/", overview),
            Route("/login", login_page, methods=["GET"]),
            Route("/login", login, methods=["POST"]),
            Route("/logout", logout, methods=["POST"]),
            Route("/dead-letters", listing),
            Route("/dead-letters/{key}", detail),
            Route("/act", act, methods=["POST"]),
            Route("/replay", replay_selected, methods=["POST"]),
            Route("/sessions", sessions_page, methods=["GET"]),
            Route("/sessions/end", end_sessions, methods=["POST"]),
            Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
        ],
        exception_handlers={HTTPException: http_error, Exception: server_error},
        lifespan=lifespan,
    )
    app.state.console = console
    return app
