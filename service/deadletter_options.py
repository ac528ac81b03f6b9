"""The command line of ``python -m service.deadletters``: its subcommands and options.

``service/deadletters.py`` runs them; what each selects is ``service/ops/plans.py``'s.
"""

from __future__ import annotations

import argparse
import re

from service.adapters.postgres.dead_letter_pages import PAGE
from service.cli import common_options, positive
from service.ops import plans

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
TIME_HELP = "ISO 8601, UTC without an offset, or how long ago: 90m, 6h, 3d, 2w"


def parse_duration(text: str) -> float:
    """``90s``, ``15m``, ``2h``, ``1d`` in seconds."""
    match = _DURATION.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"not a duration like 90s, 15m, 2h or 1d: {text!r}")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand, with its options."""
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
        actions,
        "replay",
        "republish dead commands, send dead webhook deliveries again (audited)",
        common,
        plan=True,
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
    if plan:
        _window_options(parser)
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
        help=f"with --all: at most this many (default and most: {plans.PLAN_LIMIT}"
        + (f"; with --endpoint {plans.ENDPOINT_PLAN_LIMIT})" if plan else ")"),
    )
    return parser


def _window_options(parser: argparse.ArgumentParser) -> None:
    """A replay's group by endpoint and by when its dead letters were last dead-lettered."""
    parser.add_argument(
        "--endpoint",
        metavar="NAME",
        help="with --all: only the dead webhook deliveries to this endpoint (a name no "
        f"endpoint has selects nothing); up to {plans.ENDPOINT_PLAN_LIMIT} at once, not "
        f"{plans.PLAN_LIMIT}, replayed {PAGE} per transaction",
    )
    parser.add_argument(
        "--since",
        metavar="TIME",
        help="with --all: only those last dead-lettered (last_seen) at or after TIME "
        f"({TIME_HELP})",
    )
    parser.add_argument(
        "--until",
        metavar="TIME",
        help="with --all: only those last dead-lettered before TIME (default: no bound; "
        "those dead-lettered after the dry run are left out all the same, and named)",
    )
