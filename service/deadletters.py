"""``python -m service.deadletters``: list, show, replay, assign, note, close, reopen and tidy
dead-lettered commands.

What each action does is ``service/ops``': what an act selects and how its
confirmation acts on exactly what its dry run showed (``plans.py``), what a
replay will do and who may (``dead_letters.py``), the replay itself
(``replay.py``) and the walk of the dead queue (``dead_queue.py``). This module
reads the command line, opens the database (and, where needed, the broker),
prints and chooses the exit code.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
from typing import Any

from service.adapters import amqp, postgres
from service.adapters.amqp.connection import UNREACHABLE
from service.cli import common_options, positive, run_command
from service.core.errors import UsageError
from service.ops import dead_letters, dead_queue, plan_file, plans, replay
from service.ops.dead_letters import NEEDS_OPERATOR
from service.settings import Settings

NAME = "expiry-deadletters"
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """``90s``, ``15m``, ``2h``, ``1d`` in seconds."""
    match = _DURATION.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"not a duration like 90s, 15m, 2h or 1d: {text!r}")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


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
    is refused: it would select nothing)."""
    error_class = dead_letters.filter_value(args.error_class, "--error-class")
    give_up = dead_letters.filter_value(args.give_up, "--give-up")
    if args.all:
        return plans.Selection(group=plans.Group(error_class, give_up, args.status))
    if error_class or give_up or args.status:
        raise UsageError("--error-class, --give-up and --status select a group: add --all")
    return plans.Selection(keys=plans.keys_of(args.ids))


async def replay_command(settings: Settings, args: argparse.Namespace) -> int:
    """``replay``: the dry run, then (confirmed for a group) the replay of exactly what it
    listed; or (``--plan``) the replay of exactly what a saved dry run listed. The dead
    letters left out, and the group's newcomers, are named. A refused replay is audited
    on each dead letter it selected, one without ``--operator`` too."""
    actor = _actor_of(args)
    saved = _saved_plan(args)
    async with postgres.connected(settings, name=NAME) as conn:
        if actor is None:
            rows = await _selected_anyway(conn, args, saved)
            await dead_letters.refuse(conn, dead_letters.unnamed_actor(), rows, NEEDS_OPERATOR)
        planned, rows = await _planned(conn, args, saved)
        lines: list[str] = []
        if saved is None:
            shown = replay.dry_run(rows, await dead_letters.expectations(conn, rows, settings))
            lines = replay.report_lines(shown, dry_run=True) + plans.tail_lines(planned)
            if args.dry_run:
                return _print(args, lines, plan_file.document(planned, shown))
        if not planned.items:
            empty = replay.report_lines([], dry_run=False) + plans.tail_lines(planned)
            return _print(args, empty, {"results": [], "left_out": [], "beyond": planned.beyond})
        assert actor is not None  # refused above
        why = dead_letters.refusal(settings, actor) or await unconfirmed(
            args, actor, lines, len(rows)
        )
        if why is not None:
            await dead_letters.refuse(conn, actor, rows, why)
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
    lines = replay.report_lines(results, dry_run=False) + confirmed.lines()
    machine = {
        "results": [r.as_json() for r in results],
        "left_out": _left_out(confirmed),
        "beyond": planned.beyond,
    }
    _print(args, lines, machine)
    return 1 if replay.any_failed(results) else 0


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
    if args.error_class is not None or args.give_up is not None or args.status is not None:
        raise UsageError("--plan carries its selection: no --error-class, --give-up or --status")
    if args.dry_run:
        raise UsageError("--plan replays a saved dry run: without --dry-run")
    return plan_file.read(args.plan)


async def _planned(
    conn: postgres.Connection, args: argparse.Namespace, saved: plans.Plan | None
) -> tuple[plans.Plan, list[Any]]:
    """A new plan and its records, or the saved plan and its records as they are now."""
    if saved is None:
        return await plans.plan(conn, "replay", selection_of(args), args.limit)
    return saved, await plans.records_of(conn, saved)


async def _selected_anyway(
    conn: postgres.Connection, args: argparse.Namespace, saved: plans.Plan | None
) -> list[Any]:
    """The records a replay without ``--operator`` asked for, to audit its refusal on
    (none, when it names none that can be replayed)."""
    try:
        return (await _planned(conn, args, saved))[1]
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m service.deadletters",
        description="List, show, replay, own, close and tidy dead-lettered expiration commands.",
    )
    actions = parser.add_subparsers(dest="action", required=True)
    common = [common_options()]
    lister = actions.add_parser("list", help="dead letters, newest first", parents=common)
    lister.add_argument(
        "--error-class", help="only this class, e.g. db.unavailable, poison.not-json"
    )
    lister.add_argument(
        "--older-than",
        type=parse_duration,
        metavar="AGE",
        help="last seen at least AGE ago (90s, 15m, 2h, 1d)",
    )
    lister.add_argument(
        "--newer-than", type=parse_duration, metavar="AGE", help="last seen within AGE"
    )
    lister.add_argument("--status", choices=("dead", "closed", "replayed", "all"), default="dead")
    lister.add_argument("--limit", type=positive(int, "a whole number"), default=100)
    lister.add_argument("--json", action="store_true", help="machine-readable output")
    shower = actions.add_parser(
        "show", help="everything known about one dead letter", parents=common
    )
    shower.add_argument("id", help="record id or message id")
    shower.add_argument("--json", action="store_true")
    replayer = _selecting_parser(
        actions, "replay", "republish dead letters (audited)", common, plan=True
    )
    replayer.add_argument(
        "--dry-run",
        action="store_true",
        help="show what would happen, change nothing (with --json: a plan to save for --plan)",
    )
    replayer.add_argument("--json", action="store_true", help="machine-readable output")
    for action, what, text in ACTS:
        _selecting_parser(actions, action, what, common).add_argument(
            "--text", required=True, help=text
        )
    tidier = actions.add_parser(
        "tidy",
        help="take copies of closed and replayed dead letters off expirations.dead",
        parents=common,
    )
    tidier.add_argument("--operator", help="who does it (required; in EXPIRY_REPLAY_OPERATORS)")
    tidier.add_argument("--dry-run", action="store_true", help="count, change nothing")
    return parser


ACTS = (
    ("assign", "give dead letters an owner (audited)", "the owner"),
    ("note", "set dead letters' note (audited)", "the note"),
    (
        "close",
        "close without a replay, park the hold, take its message off expirations.dead (audited)",
        "why it will not be replayed",
    ),
    ("reopen", "reopen a closed dead letter, and unpark its hold (audited)", "why"),
)


def _selecting_parser(
    actions: argparse._SubParsersAction[argparse.ArgumentParser],
    action: str,
    what: str,
    parents: list[argparse.ArgumentParser],
    *,
    plan: bool = False,
) -> argparse.ArgumentParser:
    """A subcommand that acts on named dead letters, or on a group with ``--all`` (or, with
    ``plan``, on the dead letters a saved dry run listed)."""
    parser = actions.add_parser(action, help=what, parents=parents)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("ids", nargs="*", default=[], metavar="ID", help="record or message ids")
    target.add_argument(
        "--all",
        action="store_true",
        help="a whole group, as the filters below describe it (every open one without them); "
        "its list is shown and confirmed first",
    )
    if plan:
        target.add_argument(
            "--plan",
            metavar="FILE",
            help="exactly the dead letters a saved dry run listed (replay ... --dry-run --json "
            "> FILE): those changed or gone since are left out and named, as are newcomers",
        )
    parser.add_argument("--error-class", help="with --all: only this error class")
    parser.add_argument("--give-up", help="with --all: only this give-up reason")
    parser.add_argument("--status", choices=("dead", "closed"), help="with --all: only this status")
    parser.add_argument(
        "--operator",
        help="who does it (required; audited with the database user, the OS user and the "
        "host; replay, close and reopen: one of EXPIRY_REPLAY_OPERATORS)",
    )
    parser.add_argument(
        "--yes", action="store_true", help="with --all: without asking (needed off a terminal)"
    )
    parser.add_argument(
        "--limit",
        type=positive(int, "a whole number"),
        default=plans.PLAN_LIMIT,
        help=f"with --all: at most this many (at most {plans.PLAN_LIMIT})",
    )
    return parser


def main() -> None:
    """Entry point."""
    run_command(build_parser(), _main)


if __name__ == "__main__":
    main()
