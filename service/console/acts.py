"""The acts: assign, note, close, reopen and replay, of one dead letter at once or of a
group once its dry run was shown and confirmed (exactly what it listed). Replaying,
closing and reopening need an operator named in ``EXPIRY_REPLAY_OPERATORS``, as on the
command line; assigning and noting need any operator; each act is audited with the
operator's name, the database user (set by the database), the console's OS user and the
browser's address. The operations are ``service/ops``', the command line's own."""

from __future__ import annotations

import contextlib
from typing import Any
from urllib.parse import quote

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response

from service.adapters import amqp, postgres
from service.console import guard
from service.console.web import (
    Console,
    console_of,
    field_of,
    logged_in,
    page,
    posted,
    refused,
)
from service.core.errors import UsageError
from service.ops import dead_letters, dead_queue, plans, replay

ACTS = ("assign", "note", "close", "reopen")


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
    at = plans.parse_time(field_of(form, "planned_at", plans.TIME_LIMIT))
    return plans.Plan(act, selection, items, at=at)


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
        planned_at=planned.at.isoformat() if planned.at is not None else "",
        count=len(planned.items),
        guarded=act in ("replay", *dead_letters.GUARDED),
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
        async with amqp.connected(console.settings, name=f"expiry-console {actor.operator}") as c:
            return await replay.replay(console.settings, conn, c, rows, actor, expectations)
    except (OSError, ConnectionError, TimeoutError):
        return None
