"""The console's web application (Starlette, server-rendered, no JavaScript): the pages
that read (the overview, the dead letters, one dead letter, an event's webhooks), the
routes of the acts (``acts``) and of logging in (``login``), the error pages, and
``guard.Guard`` outside it all. What every page is made with is in ``web``."""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from service.adapters import classify, postgres
from service.console import acts, auth, guard, login, pages, sessions
from service.console.web import HERE, Console, console_of, logged_in, page, refused
from service.ops import dead_letters, event_history
from service.settings import Settings

log = logging.getLogger("service.console")

POOL_SIZE = 4


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


@logged_in
async def events(request: Request, operator: str) -> Response:
    """What happened to an event (``?id=``: its message id or reservation id), endpoint by
    endpoint: every webhook attempt and where each delivery stands."""
    asked = request.query_params.get("id", "").strip()[:300]
    console = console_of(request)
    assert console.pool is not None
    stories = []
    if asked:
        async with console.pool.acquire() as conn:
            stories = await event_history.read(conn, asked)
    return page(request, "events.html", asked=asked, stories=stories)


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
        async with postgres.pooled(settings, name="expiry-console", size=POOL_SIZE) as pool:
            console.pool = pool
            try:
                yield
            finally:
                if console.broker is not None:
                    await console.broker.close()

    app = GuardedStarlette(
        routes=[
            Route("/", overview),
            Route("/login", login.login_page, methods=["GET"]),
            Route("/login", login.login, methods=["POST"]),
            Route("/logout", login.logout, methods=["POST"]),
            Route("/dead-letters", listing),
            Route("/dead-letters/{key}", detail),
            Route("/events", events),
            Route("/act", acts.act, methods=["POST"]),
            Route("/replay", acts.replay_selected, methods=["POST"]),
            Route("/sessions", login.sessions_page, methods=["GET"]),
            Route("/sessions/end", login.end_sessions, methods=["POST"]),
            Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
        ],
        exception_handlers={HTTPException: http_error, Exception: server_error},
        lifespan=lifespan,
    )
    app.state.console = console
    return app
