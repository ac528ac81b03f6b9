"""Logging in and out, and the sessions page: the routes over ``service/console/sessions.py``
(throttled, audited logins; sessions kept in PostgreSQL)."""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from service.adapters.postgres import console as store
from service.console import pages, sessions, web
from service.core.durations import human
from service.settings import OPERATOR_LIMIT

log = logging.getLogger("service.console")

LOGIN_FAILURE_PAUSE_SECONDS = 0.5


async def login_page(request: Request) -> Response:
    """The login form (a trusted proxy's operators are never asked)."""
    if web.console_of(request).settings.console_trusted_header:
        return RedirectResponse("/", status_code=303)
    return _login_form(request)


def _login_form(request: Request, status: int = 200, **context: Any) -> Response:
    """The login form, its CSRF token bound to this browser's login cookie."""
    console = web.console_of(request)
    login_cookie = sessions.cookie(request.cookies.get(sessions.LOGIN_COOKIE))
    fresh = login_cookie is None
    login_cookie = login_cookie or secrets.token_urlsafe(32)
    token = console.sessions.login_token(login_cookie)
    response = web.page(request, "login.html", status=status, csrf=token, **context)
    if fresh:
        web.set_cookie(response, sessions.LOGIN_COOKIE, login_cookie, path="/login")
    return response


async def login(request: Request) -> Response:
    """Check the name and password (throttled, audited); begin the operator's session."""
    console = web.console_of(request)
    if console.settings.console_trusted_header:
        return RedirectResponse("/", status_code=303)
    form = await request.form(max_files=0, max_fields=10)
    if not console.sessions.login_form_ok(
        request.cookies.get(sessions.LOGIN_COOKIE), form.get("csrf")
    ):
        return web.refused(request, 403, "the form expired: reload the login page")
    name, password = web.field_of(form, "name", OPERATOR_LIMIT), form.get("password")
    secret = password if isinstance(password, str) else ""
    client = web.client_of(request)
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
    web.set_session_cookie(response, token)
    web.set_cookie(
        response, sessions.DEVICE_COOKIE, device, path="/login", max_age=sessions.DEVICE_SECONDS
    )
    return response


@web.logged_in
async def logout(request: Request, operator: str) -> Response:
    """End the session at once."""
    if await web.posted(request) is None:
        return web.refused(request, 403, "the form expired")
    console = web.console_of(request)
    assert console.pool is not None
    async with console.pool.acquire() as conn:
        await console.sessions.end(conn, request.cookies.get(sessions.SESSION_COOKIE), operator)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(sessions.SESSION_COOKIE, path="/")
    return response


@web.logged_in
async def sessions_page(request: Request, operator: str) -> Response:
    """The open sessions, for an operator who may end them (one of EXPIRY_REPLAY_OPERATORS)."""
    console = web.console_of(request)
    if (why := console.may(operator, "end sessions")) is not None:
        return web.refused(request, 403, why)
    assert console.pool is not None
    s = console.settings
    async with console.pool.acquire() as conn:
        rows = await store.open_sessions(
            conn, s.console_session_idle_seconds, s.console_session_max_seconds
        )
    mine = request.state.session.id
    shown = [pages.session_row(row, mine) for row in rows]
    return web.page(
        request,
        "sessions.html",
        sessions=shown,
        idle=human(s.console_session_idle_seconds),
        longest=human(s.console_session_max_seconds),
    )


@web.logged_in
async def end_sessions(request: Request, operator: str) -> Response:
    """End one session (``session``: its number) or every session of an operator
    (``operator``), as an operator who may; each one ended says by whom."""
    console = web.console_of(request)
    form = await web.posted(request)
    if form is None:
        return web.refused(request, 403, "the form expired: reload the page")
    if (why := console.may(operator, "end sessions")) is not None:
        return web.refused(request, 403, why)
    whose = web.field_of(form, "operator", OPERATOR_LIMIT)
    number = web.field_of(form, "session", 20)
    if not whose and not number.isdigit():
        return web.refused(request, 400, "nothing selected: name an operator or a session")
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
    return web.page(request, "result.html", title="end sessions", lines=lines, back="/sessions")
