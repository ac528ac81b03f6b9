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
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.adapters import amqp, lifecycle, postgres
from service.console import auth, pages
from service.core import recorded_policy
from service.core.errors import UsageError
from service.core.inputs import clean_text
from service.ops import dead_letters, dead_queue, plans, replay
from service.settings import OPERATOR_LIMIT, Settings

log = logging.getLogger("service.console")

HERE = Path(__file__).resolve().parent
POOL_SIZE = 4
SESSION_SECONDS = 8 * 3600
LOGIN_FAILURE_PAUSE_SECONDS = 0.5
BROKER_RETRY_SECONDS = 10.0
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}
ACTS = ("assign", "note", "close", "reopen")
# A confirm form's plan: up to 1,000 ``id:revision`` pairs.
PLAN_FIELD_LIMIT = 40 * 1024

templates = Jinja2Templates(directory=str(HERE / "templates"))
templates.env.filters["cell"] = dead_letters.cell
templates.env.globals["describe_policy"] = recorded_policy.describe


@dataclass
class Console:
    """What the application holds while it runs."""

    settings: Settings
    users: dict[str, str]
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
        """Why ``operator`` may not replay, close or reopen (None: it may)."""
        if doing not in ("replay", "close", "reopen"):
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


def operator_of(request: Request) -> str | None:
    """The logged-in operator, or the trusted proxy's name for them; None if nobody."""
    console = console_of(request)
    header = console.settings.console_trusted_header
    if header:
        proxied = clean_text(request.headers.get(header, "").strip(), OPERATOR_LIMIT)
        return proxied or None
    name = request.session.get("operator")
    return name if isinstance(name, str) and name in console.users else None


def csrf_token(request: Request) -> str:
    """This session's CSRF token (made on its first page)."""
    token = request.session.get("csrf")
    if isinstance(token, str) and token:
        return token
    fresh = auth.new_csrf_token()
    request.session["csrf"] = fresh
    return fresh


def page(request: Request, template: str, status: int = 200, **context: Any) -> Response:
    """A rendered page, with the operator and the CSRF token in its context."""
    context.update(operator=operator_of(request), csrf=csrf_token(request))
    return templates.TemplateResponse(request, template, context, status_code=status)


def refused(request: Request, status: int, why: str) -> Response:
    """An error page (nothing else is said: no traceback, no echo of the request)."""
    return page(request, "error.html", status=status, why=why)


Handler = Callable[[Request, str], Awaitable[Response]]


def logged_in(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """Only for an operator: else the login page (GET) or 401 (anything else)."""

    async def guarded(request: Request) -> Response:
        operator = operator_of(request)
        if operator is None:
            if request.method == "GET":
                return RedirectResponse("/login", status_code=303)
            return refused(request, 401, "log in first")
        return await handler(request, operator)

    return guarded


async def posted(request: Request) -> FormData | None:
    """The form of a POST whose CSRF token is the session's; None if it is not."""
    form = await request.form(max_files=0, max_fields=50, max_part_size=PLAN_FIELD_LIMIT)
    if not auth.csrf_matches(request.session.get("csrf"), form.get("csrf")):
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
    return page(request, "login.html")


async def login(request: Request) -> Response:
    """Check the name and password; start the operator's session."""
    console = console_of(request)
    form = await posted(request)
    if form is None:
        return refused(request, 403, "the form expired: reload the login page")
    name, password = field_of(form, "name", OPERATOR_LIMIT), form.get("password")
    secret = password if isinstance(password, str) else ""
    if not await asyncio.to_thread(auth.authenticate, console.users, name, secret):
        log.warning("console.login_failed", extra={"operator": name})
        await asyncio.sleep(LOGIN_FAILURE_PAUSE_SECONDS)
        return page(request, "login.html", status=401, failed=True)
    request.session.clear()
    request.session.update(operator=name, csrf=auth.new_csrf_token())
    log.info("console.login", extra={"operator": name})
    return RedirectResponse("/", status_code=303)


async def logout(request: Request) -> Response:
    """End the session."""
    if await posted(request) is None:
        return refused(request, 403, "the form expired")
    request.session.clear()
    return RedirectResponse("/login", status_code=303)


@logged_in
async def overview(request: Request, operator: str) -> Response:
    """Is anything stuck, and where."""
    console = console_of(request)
    broker = await console.connection()
    assert console.pool is not None
    seen = await pages.read_overview(console.pool, console.settings, broker)
    return page(request, "overview.html", seen=seen, screen=seen.status)


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
    items = plans.parse_items(field_of(form, "plan", PLAN_FIELD_LIMIT))
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


# -- the application --------------------------------------------------------------------


MAX_BODY_BYTES = 64 * 1024


class SecurityHeaders:
    """Adds SECURITY_HEADERS to every answer, and refuses a request body larger than
    MAX_BODY_BYTES (or of unknown length) before anything reads it: the login form is
    parsed for anyone."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] not in ("GET", "HEAD") and not _small_body(scope):
            await send({"type": "http.response.start", "status": 413, "headers": []})
            await send({"type": "http.response.body", "body": b"request too large\n"})
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, with_headers)


def _small_body(scope: Scope) -> bool:
    """Whether the request says it carries at most MAX_BODY_BYTES."""
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            return value.isdigit() and int(value) <= MAX_BODY_BYTES
    return False


def create_app(settings: Settings) -> Starlette:
    """The console for these settings (its database pool opens with the application)."""
    console = Console(settings, auth.users_from(settings.console_users))
    secret = settings.console_secret
    key = secret.get_secret_value() if secret is not None else secrets.token_urlsafe(48)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        async with lifecycle.database_pool(settings, name="expiry-console", size=POOL_SIZE) as pool:
            console.pool = pool
            try:
                yield
            finally:
                if console.broker is not None:
                    await console.broker.close()

    app = Starlette(
        routes=[
            Route("/", overview),
            Route("/login", login_page, methods=["GET"]),
            Route("/login", login, methods=["POST"]),
            Route("/logout", logout, methods=["POST"]),
            Route("/dead-letters", listing),
            Route("/dead-letters/{key}", detail),
            Route("/act", act, methods=["POST"]),
            Route("/replay", replay_selected, methods=["POST"]),
            Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
        ],
        middleware=[
            Middleware(SecurityHeaders),
            Middleware(
                SessionMiddleware,
                secret_key=key,
                session_cookie="expiry_console",
                max_age=SESSION_SECONDS,
                same_site="strict",
                https_only=False,  # behind a TLS proxy, the proxy sets Secure itself
            ),
        ],
        lifespan=lifespan,
    )
    app.state.console = console
    return app
