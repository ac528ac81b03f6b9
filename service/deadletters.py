"""``python -m service.deadletters``: list, show, replay, assign, note, close, reopen and tidy
dead-lettered commands.

What each action does is ``service/ops``': what an act selects and how its
confirmation acts on exactly what its dry run showed (``plans.py``), what a
replay will do and who may (``dead_letters.py``), the replay itself
(``replay.py``; one endpoint's dead webhook deliveries a page at a time:
``plan_pages.py``) and the walk of the dead queue (``dead_queue.py``). This module
reads the command line (its parser: ``deadletter_options.py``), opens the database
(and, where needed, the broker), prints and chooses the exit code.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from datetime import UTC, datetime
from typing import Any

from service.adapters import amqp, postgres
from service.adapters.amqp.connection import UNREACHABLE
from service.cli import run_command
from service.core.errors import UsageError
from service.deadletter_options import build_parser as build_parser  # its parser, re-exported
from service.ops import dead_letters, dead_queue, plan_file, plan_pages, plans, replay
from service.ops.dead_letters import NEEDS_OPERATOR
from service.settings import Settings

NAME = "expiry-deadletters"


async def list_command(settings: Settings, args: argparse.Namespace) -> int:
    """``list``: the matching dead letters, newest first."""
    filters = dead_letters.Filters(
        status=None if args.status == "all" else args.status,
        error_class=dead_letters.filter_value(args.error_class, "--error-class"),
        older_than=args.older_than,
        newer_than=args.newer_than,
        limit=args.limit,
    )
    async with postgres.connected(settings, name=NAME) as conn:
        records = await dead_letters.list_records(conn, filters)
    if args.json:
        print(json.dumps([dead_letters.jsonable(r) for r in records], indent=2))
    else:
        print("\n".join(dead_letters.list_lines(records)))
    return 0


async def show_command(settings: Settings, args: argparse.Namespace) -> int:
    """``show``: everything known about one dead letter; 1 if there is none."""
    async with postgres.connected(settings, name=NAME) as conn:
        detail = await dead_letters.read_detail(conn, args.id, settings)
    if detail is None:
        print(dead_letters.not_found(args.id))
        return 1
    print(json.dumps(detail.as_json(), indent=2) if args.json else "\n".join(detail.lines()))
    return 0


def selection_of(args: argparse.Namespace) -> plans.Selection:
    """Named dead letters, or (``--all``) the group the filters describe (an empty filter
    is refused: it would select nothing; ``--since`` and ``--until`` read as of now)."""
    error_class = dead_letters.filter_value(args.error_class, "--error-class")
    give_up = dead_letters.filter_value(args.give_up, "--give-up")
    endpoint = dead_letters.filter_value(getattr(args, "endpoint", None), "--endpoint")
    if args.all:
        since, until = getattr(args, "since", None), getattr(args, "until", None)
        window = plans.bounds(since, until, datetime.now(UTC))
        group = plans.Group(error_class, give_up, args.status, endpoint, *window)
        return plans.Selection(group=group)
    if given := _filters_given(args):
        verb = "selects" if len(given) == 1 else "select"
        raise UsageError(f"{', '.join(given)} {verb} a group: add --all")
    return plans.Selection(keys=plans.keys_of(args.ids))


def _filters_given(args: argparse.Namespace) -> list[str]:
    """The group's filters given on the command line."""
    names = ("error_class", "give_up", "status", "endpoint", "since", "until")
    return [f"--{n.replace('_', '-')}" for n in names if getattr(args, n, None) is not None]


async def replay_command(settings: Settings, args: argparse.Namespace) -> int:
    """``replay``: the dry run, then (confirmed for a group) the replay of exactly what it
    listed; or (``--plan``) the replay of exactly what a saved dry run listed. The dead
    letters left out, and the group's newcomers, are named. A refused replay is audited
    on each dead letter it selected, one without ``--operator`` too."""
    actor = _actor_of(args)
    saved = _saved_plan(args)
    selection = selection_of(args) if saved is None else saved.selection
    async with postgres.connected(settings, name=NAME) as conn:
        if actor is None:
            rows = await _selected_anyway(conn, args, saved, selection)
            await dead_letters.refuse(conn, dead_letters.unnamed_actor(), rows, NEEDS_OPERATOR)
        planned, rows = await _planned(conn, args, saved, selection)
        lines: list[str] = []
        tail = await plan_pages.tail_lines(conn, planned)
        if saved is None:
            shown = replay.dry_run(rows, await dead_letters.expectations(conn, rows, settings))
            lines = plan_pages.shown_lines(shown, dry_run=True) + tail
            if args.dry_run:
                return _print(args, lines, plan_file.document(planned, shown))
        if not planned.items:
            empty = replay.report_lines([], dry_run=False) + tail
            return _print(args, empty, {"results": [], "left_out": [], "beyond": planned.beyond})
        assert actor is not None  # refused above
        why = dead_letters.refusal(settings, actor) or await unconfirmed(
            args, actor, lines, len(rows)
        )
        if why is not None:
            await dead_letters.refuse(conn, actor, rows, why)
        results, confirmed = await _replayed(settings, conn, planned, actor)
    lines = plan_pages.shown_lines(results, dry_run=False) + confirmed.lines()
    machine = {
        "results": [r.as_json() for r in results],
        "left_out": _left_out(confirmed),
        "left_out_not_named": confirmed.unnamed,
        "beyond": planned.beyond,
    }
    _print(args, lines, machine)
    return 1 if replay.any_failed(results) else 0


async def _replayed(
    settings: Settings, conn: postgres.Connection, planned: plans.Plan, actor: postgres.Actor
) -> tuple[list[replay.ReplayResult], plans.Confirmed]:
    """Confirm the plan and replay what it claimed: one endpoint's dead deliveries a page
    per transaction (no broker), any other at once (the broker only for commands)."""
    if plan_pages.paged(planned):
        return await plan_pages.replay(conn, settings, planned, actor)
    confirmed = await plans.confirm(conn, planned)
    expectations = await dead_letters.expectations(conn, confirmed.rows, settings)
    # Webhook deliveries' dead letters are replayed in the database alone.
    broker = (
        amqp.connected(settings, name=f"{NAME} {actor.operator}")
        if replay.needs_broker(confirmed.rows)
        else contextlib.nullcontext(None)
    )
    async with broker as connection:
        results = await replay.replay(
            settings, conn, connection, confirmed.rows, actor, expectations
        )
    return results, confirmed


def _actor_of(args: argparse.Namespace) -> postgres.Actor | None:
    """Who replays (``--operator``); None when a replay names nobody, a refusal audited as
    such. A dry run needs a name too, and is refused at once without one (it changes
    nothing: there is nothing to audit)."""
    if args.dry_run or (args.operator or "").strip():
        return dead_letters.actor_named(args.operator)
    return None


def _saved_plan(args: argparse.Namespace) -> plans.Plan | None:
    """``--plan FILE``'s plan (checked: ``plan_file``), alone: it carries its selection and
    is itself the confirmation of the dry run that made it."""
    if args.plan is None:
        return None
    if given := _filters_given(args):
        raise UsageError(f"--plan carries its selection: no {', '.join(given)}")
    if args.dry_run:
        raise UsageError("--plan replays a saved dry run: without --dry-run")
    return plan_file.read(args.plan)


async def _planned(
    conn: postgres.Connection,
    args: argparse.Namespace,
    saved: plans.Plan | None,
    selection: plans.Selection,
) -> tuple[plans.Plan, list[Any]]:
    """A new plan of ``selection`` and its records, or the saved plan and its records as
    they are now."""
    if saved is None:
        return await plans.plan(conn, "replay", selection, args.limit)
    return saved, await plans.records_of(conn, saved)


async def _selected_anyway(
    conn: postgres.Connection,
    args: argparse.Namespace,
    saved: plans.Plan | None,
    selection: plans.Selection,
) -> list[Any]:
    """The records a replay without ``--operator`` asked for, to audit its refusal on
    (none, when it names none that can be replayed)."""
    try:
        return (await _planned(conn, args, saved, selection))[1]
    except UsageError:
        return []


async def act_command(settings: Settings, args: argparse.Namespace) -> int:
    """``assign``, ``note``, ``close``, ``reopen``: named dead letters, or a group (its
    list shown and confirmed first); each act audited."""
    actor = dead_letters.actor_named(args.operator)
    async with postgres.connected(settings, name=NAME) as conn:
        planned, rows = await plans.plan(conn, args.action, selection_of(args), args.limit)
        lines = plans.plan_lines(planned, rows)
        if not planned.items:
            print("\n".join(lines))
            return 0
        why = await unconfirmed(args, actor, lines, len(rows), args.action)
        if why is not None:
            raise UsageError(why)
        confirmed = await plans.confirm(conn, planned)
        results = await dead_letters.act(
            conn, settings, actor, confirmed.rows, args.action, args.text
        )
        lines = dead_letters.act_lines(results, args.action) + confirmed.lines()
        if args.action == "close":
            lines.append(await _remove_closed(settings, conn, results))
    print("\n".join(line for line in lines if line))
    return 0


async def _remove_closed(
    settings: Settings, conn: postgres.Connection, results: list[dead_letters.ActResult]
) -> str:
    """Take the closed dead letters' messages off the dead queue (their records keep them)."""
    keys = {r.message_id for r in results if r.outcome == "closed"}
    if not keys:
        return ""
    try:
        async with amqp.connected(settings, name=NAME) as connection:
            return await dead_queue.remove_copies(settings, conn, connection, keys)
    except UNREACHABLE:
        return await dead_queue.remove_copies(settings, conn, None, keys)


async def tidy_command(settings: Settings, args: argparse.Namespace) -> int:
    """``tidy``: take the copies of closed and replayed dead letters off the dead queue."""
    actor = dead_letters.actor_named(args.operator)
    if not args.dry_run and (why := dead_letters.refusal(settings, actor, "tidy")) is not None:
        raise UsageError(why)
    async with (
        postgres.connected(settings, name=NAME) as conn,
        amqp.connected(settings, name=f"{NAME} {actor.operator}") as connection,
    ):
        done = await dead_queue.tidy(settings, conn, connection, dry_run=args.dry_run)
    print(done.line(dry_run=args.dry_run))
    return 0


def _print(args: argparse.Namespace, lines: list[str], machine: dict[str, Any]) -> int:
    if getattr(args, "json", False):
        print(json.dumps(machine, indent=2))
    else:
        print("\n".join(lines))
    return 0


def _left_out(confirmed: plans.Confirmed) -> list[dict[str, Any]]:
    return [{"id": x.id, "message_id": x.message_id, "why": x.why} for x in confirmed.left_out]


async def unconfirmed(
    args: argparse.Namespace,
    actor: postgres.Actor,
    lines: list[str],
    count: int,
    doing: str = "replay",
) -> str | None:
    """A group (``--all``) is acted on once its list was shown and confirmed: at a
    terminal, or by ``--yes``; named dead letters need no confirmation."""
    if not args.all or args.yes:
        return None
    if not sys.stdin.isatty():
        return f"{doing} --all needs --yes when it is not run at a terminal"
    print("\n".join(lines))
    question = f"{doing} these {count} dead letter(s) as {actor.operator}? [y/N] "
    answer = await asyncio.to_thread(input, question)
    return None if answer.strip().lower() in ("y", "yes") else "not confirmed at the terminal"


async def _main(settings: Settings, args: argparse.Namespace) -> int:
    handlers = {
        "list": list_command,
        "show": show_command,
        "replay": replay_command,
        "tidy": tidy_command,
    }
    return await handlers.get(args.action, act_command)(settings, args)


def main() -> None:
    """Entry point."""
    run_command(build_parser(), _main)


if __name__ == "__main__":
    main()
