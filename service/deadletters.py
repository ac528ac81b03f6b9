"""``python -m service.deadletters``: list, show, replay, assign, note, close and reopen
dead-lettered commands.

What each action does is ``service/ops/dead_letters.py``'s (selection, what a
replay will do, who may) and ``service/ops/replay.py``'s (republish with
confirms, then take off the dead queue, audited); this module reads the
command line, opens the database (and, to replay, the broker), prints and
chooses the exit code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys

from service.adapters import lifecycle, postgres
from service.cli import run_command
from service.core.errors import UsageError
from service.ops import dead_letters, replay
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
        error_class=args.error_class,
        older_than=args.older_than,
        newer_than=args.newer_than,
        limit=args.limit,
    )
    async with lifecycle.database(settings, name=NAME) as conn:
        records = await dead_letters.list_records(conn, filters)
    if args.json:
        print(json.dumps([dead_letters.jsonable(r) for r in records], indent=2))
    else:
        print("\n".join(dead_letters.list_lines(records)))
    return 0


async def show_command(settings: Settings, args: argparse.Namespace) -> int:
    """``show``: everything known about one dead letter; 1 if there is none."""
    async with lifecycle.database(settings, name=NAME) as conn:
        detail = await dead_letters.read_detail(conn, args.id)
    if detail is None:
        print(dead_letters.not_found(args.id))
        return 1
    print(json.dumps(detail.as_json(), indent=2) if args.json else "\n".join(detail.lines()))
    return 0


async def replay_command(settings: Settings, args: argparse.Namespace) -> int:
    """``replay``: republish the selected dead letters (or, dry, say what that would do)."""
    actor = dead_letters.actor_named(args.operator)
    async with lifecycle.database(settings, name=NAME) as conn:
        key = None if args.all else args.id
        rows = await dead_letters.select(conn, key, error_class=args.error_class, limit=args.limit)
        expectations = await dead_letters.expectations(conn, rows)
        if args.dry_run:
            results = replay.dry_run(rows, expectations)
        else:
            why = dead_letters.refusal(settings, actor) or await unconfirmed(args, actor, len(rows))
            if why is not None:
                await dead_letters.refuse(conn, actor, rows, why)
            async with lifecycle.broker(settings, name=f"{NAME} {actor.operator}") as connection:
                results = await replay.replay(settings, conn, connection, rows, actor, expectations)
    print("\n".join(replay.report_lines(results, dry_run=args.dry_run)))
    return 1 if replay.any_failed(results) else 0


# What each act selects: only open dead letters are assigned, noted or closed; only
# closed ones are reopened.
ACT_STATUSES = {
    "assign": dead_letters.OPEN,
    "note": dead_letters.OPEN,
    "close": ("dead",),
    "reopen": ("closed",),
}


async def act_command(settings: Settings, args: argparse.Namespace) -> int:
    """``assign``, ``note``, ``close``, ``reopen``: one dead letter, or a group (audited)."""
    actor = dead_letters.actor_named(args.operator)
    async with lifecycle.database(settings, name=NAME) as conn:
        rows = await dead_letters.select(
            conn,
            None if args.all else args.id,
            error_class=args.error_class,
            give_up=args.give_up,
            limit=args.limit,
            statuses=ACT_STATUSES[args.action],
            doing=args.action,
        )
        why = await unconfirmed(args, actor, len(rows), args.action)
        if why is not None:
            raise UsageError(why)
        results = await dead_letters.act(conn, settings, actor, rows, args.action, args.text)
    print("\n".join(dead_letters.act_lines(results, args.action)))
    return 0


async def unconfirmed(
    args: argparse.Namespace, actor: postgres.Actor, count: int, doing: str = "replay"
) -> str | None:
    """``--all`` acts on many at once: confirmed at a terminal, or by ``--yes``."""
    if not args.all or args.yes:
        return None
    if not sys.stdin.isatty():
        return f"{doing} --all needs --yes when it is not run at a terminal"
    question = f"{doing} {count} dead letter(s) as {actor.operator}? [y/N] "
    answer = await asyncio.to_thread(input, question)
    return None if answer.strip().lower() in ("y", "yes") else "not confirmed at the terminal"


async def _main(settings: Settings, args: argparse.Namespace) -> int:
    handlers = {"list": list_command, "show": show_command, "replay": replay_command}
    return await handlers.get(args.action, act_command)(settings, args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m service.deadletters",
        description="List, show and replay dead-lettered expiration commands.",
    )
    actions = parser.add_subparsers(dest="action", required=True)
    lister = actions.add_parser("list", help="dead letters, newest first")
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
    lister.add_argument("--limit", type=int, default=100)
    lister.add_argument("--json", action="store_true", help="machine-readable output")
    shower = actions.add_parser("show", help="everything known about one dead letter")
    shower.add_argument("id", help="record id or message id")
    shower.add_argument("--json", action="store_true")
    replayer = actions.add_parser("replay", help="republish dead letters (audited)")
    target = replayer.add_mutually_exclusive_group(required=True)
    target.add_argument("id", nargs="?", help="record id or message id")
    target.add_argument(
        "--all", action="store_true", help="every open dead letter (filter with --error-class)"
    )
    replayer.add_argument("--error-class", help="with --all: only this class")
    replayer.add_argument(
        "--operator",
        help="who is replaying (required; must be in EXPIRY_REPLAY_OPERATORS; audited with "
        "the database user, the OS user and the host)",
    )
    replayer.add_argument(
        "--dry-run", action="store_true", help="show what would happen, change nothing"
    )
    replayer.add_argument(
        "--yes",
        action="store_true",
        help="with --all: replay without asking (needed when not run at a terminal)",
    )
    replayer.add_argument("--limit", type=int, default=1000, help="with --all: at most this many")
    for action, what, text in ACTS:
        _act_parser(actions, action, what, text)
    return parser


ACTS = (
    ("assign", "give dead letters an owner (audited)", "the owner"),
    ("note", "set dead letters' note (audited)", "the note"),
    ("close", "close without a replay, and park the hold (audited)", "why it will not be replayed"),
    ("reopen", "reopen a closed dead letter, and unpark its hold (audited)", "why"),
)


def _act_parser(
    actions: argparse._SubParsersAction[argparse.ArgumentParser], action: str, what: str, text: str
) -> None:
    parser = actions.add_parser(action, help=what)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("id", nargs="?", help="record id or message id")
    target.add_argument("--all", action="store_true", help="a whole group (filter below)")
    parser.add_argument("--error-class", help="with --all: only this class")
    parser.add_argument("--give-up", help="with --all: only this give-up reason")
    parser.add_argument("--text", required=True, help=text)
    parser.add_argument("--operator", help="who does it (required; audited)")
    parser.add_argument("--yes", action="store_true", help="with --all: without asking")
    parser.add_argument("--limit", type=int, default=1000, help="with --all: at most this many")


def main() -> None:
    """Entry point."""
    run_command(build_parser(), _main)


if __name__ == "__main__":
    main()
