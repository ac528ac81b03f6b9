"""``python -m service.deadletters``: list, show and replay dead-lettered commands.

Dead letters are an operator workflow, not a trash can: each has a record
(``dead_letters``), and each replay is an explicit, audited act by a named
operator (``dead_letter_replays``). A replay republishes the command with the
same message id and a fresh attempt budget, with publisher confirms, and only
then removes it from ``expirations.dead``. Replaying a hold that has since been
consumed or expired is harmless: the guarded update makes it a no-op.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import logging
import os
import re
import socket
import sys
from dataclasses import dataclass
from typing import Any

import asyncpg
from aio_pika.abc import AbstractExchange, AbstractIncomingMessage, AbstractQueue

from service.adapters import amqp, postgres
from service.adapters.amqp import messages
from service.adapters.amqp.returns import give_back
from service.cli import run_command
from service.core.dead_letter import REPLAYED_BY_HEADER, stable_message_id
from service.core.domain import command_body
from service.core.errors import PublishNotConfirmed, UsageError
from service.core.inputs import clean_text
from service.core.topology import DEAD_EXCHANGE, DEAD_QUEUE, EXCHANGE, ROUTING_KEY
from service.settings import OPERATOR_LIMIT, Settings

log = logging.getLogger("service.deadletters")

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
CELL_LIMIT = 1000
LIST_COLUMNS = ("id", "last_seen", "error_class", "give_up", "attempts", "reservation_id", "status")


def parse_duration(text: str) -> float:
    """``90s``, ``15m``, ``2h``, ``1d`` in seconds."""
    match = _DURATION.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"not a duration like 90s, 15m, 2h or 1d: {text!r}")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def _cell(value: Any) -> str:
    """A value as shown: never a control character (records hold sender-made text)."""
    if value is None:
        return "-"
    if hasattr(value, "isoformat"):
        return str(value.isoformat(timespec="seconds"))
    return clean_text(str(value), CELL_LIMIT)


def render_table(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    """A plain, aligned text table."""
    cells = [[_cell(row.get(column)) for column in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(line.rstrip() for line in lines)


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (_cell(v) if v is not None else None) for k, v in row.items()}


# -- list and show --------------------------------------------------------------


async def list_command(settings: Settings, args: argparse.Namespace) -> int:
    conn = await postgres.connect(settings, application_name="expiry-deadletters")
    try:
        rows = await postgres.list_dead_letters(
            conn,
            status=None if args.status == "all" else args.status,
            error_class=args.error_class,
            older_than=args.older_than,
            newer_than=args.newer_than,
            limit=args.limit,
        )
    finally:
        await conn.close()
    records = [dict(row) for row in rows]
    if args.json:
        print(json.dumps([_jsonable(r) for r in records], indent=2))
    elif not records:
        print("no dead letters match")
    else:
        print(render_table(records, LIST_COLUMNS))
        print(
            f"\n{len(records)} dead letter(s); details: show ID; retry: replay ID --operator NAME"
        )
    return 0


async def show_command(settings: Settings, args: argparse.Namespace) -> int:
    conn = await postgres.connect(settings, application_name="expiry-deadletters")
    try:
        row = await postgres.get_dead_letter(conn, args.id)
        if row is None:
            print(f"no dead letter {args.id!r} (give a record id or a message id)")
            return 1
        record = dict(row)
        transitions = (
            [dict(t) for t in await postgres.transitions_of(conn, row["reservation_id"])]
            if row["reservation_id"]
            else []
        )
        state = (
            await postgres.reservation_state(conn, row["reservation_id"])
            if row["reservation_id"]
            else None
        )
        replays = [dict(r) for r in await postgres.replays_of(conn, row["id"])]
    finally:
        await conn.close()
    record["reservation_status"] = state[0] if state else None
    if args.json:
        out = {**_jsonable(record), "transitions": [_jsonable(t) for t in transitions]}
        out["replays"] = [_jsonable(r) for r in replays]
        print(json.dumps(out, indent=2))
        return 0
    width = max(len(k) for k in record)
    for key, value in record.items():
        print(f"{key.ljust(width)}  {_cell(value)}")
    print("\ntransitions (audit trail):")
    print(
        render_table(
            transitions, ("at", "from_status", "to_status", "attempt", "worker", "message_id")
        )
        if transitions
        else "  none"
    )
    print("\nreplays:")
    columns = ("at", "operator", "db_user", "os_user", "client_host", "outcome", "detail")
    print(render_table(replays, columns) if replays else "  none")
    return 0


# -- replay ---------------------------------------------------------------------


@dataclass
class ReplayResult:
    """What happened to one selected dead letter."""

    record_id: int
    message_id: str
    outcome: str  # republished, not-in-queue, publish-failed, would-republish
    detail: str


async def _select(conn: postgres.Connection, args: argparse.Namespace) -> list[asyncpg.Record]:
    if args.all:
        return await postgres.list_dead_letters(
            conn,
            status="dead",
            error_class=args.error_class,
            older_than=None,
            newer_than=None,
            limit=args.limit,
        )
    row = await postgres.get_dead_letter(conn, args.id)
    if row is None:
        raise UsageError(f"no dead letter {args.id!r} (give a record id or a message id)")
    if row["status"] != "dead":
        raise UsageError(f"dead letter {args.id!r} is {row['status']} already; nothing to replay")
    return [row]


async def _expectation(conn: postgres.Connection, row: asyncpg.Record) -> str:
    if row["reservation_id"] is None:
        return "the body is unusable: it will be dead-lettered again"
    state = await postgres.reservation_state(conn, row["reservation_id"])
    if state is None:
        return "the reservation does not exist: it will be dead-lettered again"
    status, due = state
    if status == "held" and due:
        return "the hold is held and due: it will expire"
    return f"the hold is {status}{'' if due else ' and not due'}: a harmless no-op"


async def replay_command(settings: Settings, args: argparse.Namespace) -> int:
    actor = _actor(args)
    conn = await postgres.connect(settings, application_name="expiry-deadletters")
    try:
        rows = await _select(conn, args)
        expectations = {row["id"]: await _expectation(conn, row) for row in rows}
        if args.dry_run:
            results = [
                ReplayResult(r["id"], r["message_id"], "would-republish", expectations[r["id"]])
                for r in rows
            ]
        else:
            await _authorise(settings, conn, args, actor, rows)
            results = await _replay(settings, conn, rows, actor, expectations)
    finally:
        await conn.close()
    return _report(results, dry_run=args.dry_run)


def _actor(args: argparse.Namespace) -> postgres.Actor:
    """Who replays: the ``--operator`` name, the OS user and this host."""
    operator = clean_text((args.operator or "").strip(), OPERATOR_LIMIT)
    if not operator:
        raise UsageError("replay needs --operator NAME: every replay is audited with who did it")
    return postgres.Actor(operator, clean_text(_os_user(), OPERATOR_LIMIT), socket.gethostname())


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container's arbitrary uid)
        return f"uid {os.getuid()}"


async def _authorise(
    settings: Settings,
    conn: postgres.Connection,
    args: argparse.Namespace,
    actor: postgres.Actor,
    rows: list[asyncpg.Record],
) -> None:
    """Refuse (audited, for every selected dead letter) a replay not allowed or not confirmed."""
    why = _refusal(settings, actor) or await _unconfirmed(args, actor, len(rows))
    if why is None:
        return
    for row in rows:
        await postgres.record_replay(
            conn, row["id"], row["message_id"], actor=actor, outcome="refused", detail=why
        )
    log.warning("deadletter.replay_refused", extra={"operator": actor.operator, "reason": why})
    raise UsageError(why)


def _refusal(settings: Settings, actor: postgres.Actor) -> str | None:
    if not settings.replay_operators:
        return "nobody may replay: EXPIRY_REPLAY_OPERATORS names no operator"
    if actor.operator not in settings.replay_operators:
        return f"{actor.operator!r} may not replay (not in EXPIRY_REPLAY_OPERATORS)"
    return None


async def _unconfirmed(args: argparse.Namespace, actor: postgres.Actor, count: int) -> str | None:
    """``--all`` replays many at once: confirmed at a terminal, or by ``--yes``."""
    if not args.all or args.yes:
        return None
    if not sys.stdin.isatty():
        return "replay --all needs --yes when it is not run at a terminal"
    question = f"replay {count} dead letter(s) as {actor.operator}? [y/N] "
    answer = await asyncio.to_thread(input, question)
    return None if answer.strip().lower() in ("y", "yes") else "not confirmed at the terminal"


def _report(results: list[ReplayResult], *, dry_run: bool) -> int:
    for result in results:
        print(
            f"{result.outcome:16} #{result.record_id}  {_cell(result.message_id)}  "
            f"({_cell(result.detail)})"
        )
    failed = sum(r.outcome == "publish-failed" for r in results)
    counts = {o: sum(r.outcome == o for r in results) for o in sorted({r.outcome for r in results})}
    print(
        f"replay{' (dry run)' if dry_run else ''}: {len(results)} selected, "
        + ", ".join(f"{n} {o}" for o, n in counts.items())
    )
    return 1 if failed else 0


async def _replay(
    settings: Settings,
    conn: postgres.Connection,
    rows: list[asyncpg.Record],
    actor: postgres.Actor,
    expectations: dict[int, str],
) -> list[ReplayResult]:
    wanted = {row["message_id"]: row for row in rows}
    connection = await amqp.connect(settings, name=f"expiry-deadletters {actor.operator}")
    try:
        publish_channel = await amqp.open_confirm_channel(connection)
        exchange = await publish_channel.get_exchange(EXCHANGE, ensure=False)
        dead_exchange = await publish_channel.get_exchange(DEAD_EXCHANGE, ensure=False)
        get_channel = await connection.channel(publisher_confirms=False)
        dead = await get_channel.get_queue(DEAD_QUEUE, ensure=True)
        replayer = Replayer(settings, conn, exchange, dead_exchange, actor, expectations)
        results = await replayer.from_queue(dead, wanted)
        found = {result.record_id for result in results}
        for row in rows:
            if row["id"] not in found:
                results.append(await replayer.from_record(row))
    finally:
        await connection.close()
    return results


class Replayer:
    """Republishes dead letters with confirms, then removes and audits them."""

    def __init__(
        self,
        settings: Settings,
        conn: postgres.Connection,
        exchange: AbstractExchange,
        dead_exchange: AbstractExchange,
        actor: postgres.Actor,
        expectations: dict[int, str],
    ) -> None:
        self.settings = settings
        self.conn = conn
        self.exchange = exchange
        self.dead_exchange = dead_exchange
        self.actor = actor
        self.expectations = expectations

    async def from_queue(
        self, dead: AbstractQueue, wanted: dict[str, asyncpg.Record]
    ) -> list[ReplayResult]:
        """Take each message of the dead queue once; replay the wanted, give back the rest."""
        depth = (await dead.declare()).message_count or 0
        results: list[ReplayResult] = []
        others: list[AbstractIncomingMessage] = []
        for _ in range(depth):
            message = await dead.get(
                no_ack=False, fail=False, timeout=self.settings.publish_timeout_seconds
            )
            if message is None:
                break
            row = wanted.get(stable_message_id(message.message_id, message.body))
            if row is None or row["id"] in {r.record_id for r in results}:
                others.append(message)
                continue
            results.append(await self._republish(row, message.body, message))
        for message in others:
            await self._give_back(message)
        return results

    async def from_record(self, row: asyncpg.Record) -> ReplayResult:
        """The message is not in the dead queue: rebuild it from the record if it can be."""
        if row["reservation_id"] is None or row["hold_until"] is None:
            return await self._audit(
                row, "not-in-queue", "not in expirations.dead and no command to rebuild"
            )
        body = command_body(row["reservation_id"], row["hold_until"])
        return await self._republish(row, body, None, rebuilt=True)

    async def _republish(
        self,
        row: asyncpg.Record,
        body: bytes,
        original: AbstractIncomingMessage | None,
        *,
        rebuilt: bool = False,
    ) -> ReplayResult:
        message = messages.command(
            body, row["message_id"], headers={REPLAYED_BY_HEADER: self.actor.operator}
        )
        try:
            await amqp.publish_confirmed(
                self.exchange, message, ROUTING_KEY, timeout=self.settings.publish_timeout_seconds
            )
        except PublishNotConfirmed as exc:
            if original is not None:
                await self._give_back(original)
            return await self._audit(row, "publish-failed", str(exc))
        # Only now, with the copy confirmed, does the dead letter leave its queue.
        if original is not None:
            await amqp.settle(original.ack, row["message_id"])
        source = "rebuilt from the record" if rebuilt else "from expirations.dead"
        return await self._audit(row, "republished", f"{source}; {self.expectations[row['id']]}")

    async def _give_back(self, message: AbstractIncomingMessage) -> None:
        """Return a message to expirations.dead (a fresh copy once it was returned often)."""
        await give_back(
            message,
            dead_exchange=self.dead_exchange,
            queue=DEAD_QUEUE,
            timeout=self.settings.publish_timeout_seconds,
        )

    async def _audit(self, row: asyncpg.Record, outcome: str, detail: str) -> ReplayResult:
        await postgres.record_replay(
            self.conn,
            row["id"],
            row["message_id"],
            actor=self.actor,
            outcome=outcome,
            detail=detail,
        )
        log.info(
            "deadletter.replay",
            extra={
                "message_id": row["message_id"],
                "operator": self.actor.operator,
                "outcome": outcome,
            },
        )
        return ReplayResult(row["id"], row["message_id"], outcome, detail)


# -- command line ------------------------------------------------------------------


async def _main(settings: Settings, args: argparse.Namespace) -> int:
    handler = {"list": list_command, "show": show_command, "replay": replay_command}[args.action]
    return await handler(settings, args)


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
    lister.add_argument("--status", choices=("dead", "replayed", "all"), default="dead")
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
    return parser


def main() -> None:
    """Entry point."""
    run_command(build_parser(), _main)


if __name__ == "__main__":
    main()
