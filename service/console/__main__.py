"""Entry point of ``python -m service.console``: ``serve`` (the default), ``hash-password``,
``sessions`` (the open ones) and ``end-sessions`` (of operators, or by number)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import logging
import sys
from collections.abc import Iterator

import uvicorn

from service.adapters import postgres
from service.adapters.postgres import console as store
from service.cli import run_command, stop_on_signals
from service.console import auth, protocol
from service.console.app import create_app
from service.core.durations import human
from service.core.errors import UsageError
from service.ops import dead_letters
from service.settings import Settings

log = logging.getLogger("service.console")


async def serve(settings: Settings, args: argparse.Namespace) -> int:
    """Serve the console until SIGTERM or SIGINT (uvicorn's own handlers)."""
    if args.command == "hash-password":
        return hash_password()
    if args.command == "sessions":
        return await list_sessions(settings, as_json=args.json)
    if args.command == "end-sessions":
        return await end_sessions(settings, args)
    if not settings.console_users and not settings.console_trusted_header:
        raise UsageError(
            "nobody could log in: set EXPIRY_CONSOLE_USERS (python -m service.console "
            "hash-password) or EXPIRY_CONSOLE_TRUSTED_HEADER"
        )
    if settings.console_secret is None:
        log.warning("console.ephemeral_secret")  # a login form must be reloaded after a restart
    config = uvicorn.Config(
        create_app(settings),
        host=settings.console_host,
        port=settings.console_port,
        log_config=None,
        access_log=False,
        server_header=False,
        proxy_headers=False,
        lifespan="on",
        http=protocol.http_protocol(),
        h11_max_incomplete_event_size=protocol.HEADER_LIMIT,
    )
    log.info(
        "console.listening",
        extra={"host": settings.console_host, "port": settings.console_port},
    )
    server = ConsoleServer(config)
    with stop_on_signals(asyncio.Event(), also=server.stop):
        await server.serve()
    log.info("console.stopped")
    return 0


class ConsoleServer(uvicorn.Server):
    """uvicorn's server, stopped by our signal handling like every command (exit 0), not
    by its own (which raises the signal again once it has stopped)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def stop(self) -> None:
        """Finish the requests under way, then return from ``serve``."""
        self.should_exit = True


def hash_password() -> int:
    """Read a password (twice at a terminal) and print its hash for EXPIRY_CONSOLE_USERS."""
    if sys.stdin.isatty():
        first = getpass.getpass("password: ")
        if getpass.getpass("again: ") != first:
            raise UsageError("the two passwords differ")
    else:
        first = sys.stdin.readline().rstrip("\n")
    if len(first) < 12:
        raise UsageError("a console password needs at least 12 characters")
    print(auth.hash_password(first))
    return 0


async def list_sessions(settings: Settings, *, as_json: bool) -> int:
    """Print the open sessions (never their tokens), one line each, or as JSON."""
    async with postgres.connected(settings, name="expiry-console sessions") as conn:
        rows = await store.open_sessions(
            conn, settings.console_session_idle_seconds, settings.console_session_max_seconds
        )
    if as_json:
        shown = [
            {
                "id": row["id"],
                "operator": dead_letters.cell(row["operator"]),
                "client": dead_letters.cell(row["client_host"]),
                "started_at": row["started_at"].isoformat(),
                "last_seen_at": row["last_seen_at"].isoformat(),
                "age_seconds": round(row["age_seconds"], 3),
                "idle_seconds": round(row["idle_seconds"], 3),
            }
            for row in rows
        ]
        print(json.dumps({"sessions": shown}, indent=2))
        return 0
    for row in rows:
        print(
            f"session {row['id']}: {dead_letters.cell(row['operator'])} from "
            f"{dead_letters.cell(row['client_host'])}, logged in {human(row['age_seconds'])} "
            f"ago, last request {human(row['idle_seconds'])} ago"
        )
    print(f"{len(rows)} open session(s)")
    return 0


async def end_sessions(settings: Settings, args: argparse.Namespace) -> int:
    """End every open session of the operators named, and the sessions numbered; audited
    with who ended them (``--operator``, one of EXPIRY_REPLAY_OPERATORS)."""
    actor = dead_letters.actor_named(args.operator)
    if (why := dead_letters.refusal(settings, actor, "end sessions")) is not None:
        raise UsageError(why)
    ids = [int(value) for value in args.id]
    if not args.operators and not ids:
        raise UsageError("name the operators whose sessions end, or --id N")
    async with postgres.connected(settings, name="expiry-console end-sessions") as conn:
        ended = await store.end_sessions(
            conn,
            list(args.operators),
            ids,
            actor.operator,
            f"ended by {actor.operator} ({actor.os_user}@{actor.host}) from the command line",
        )
    for row in ended:
        print(f"ended session {row['id']} of {dead_letters.cell(row['operator'])}")
    print(f"{len(ended)} session(s) ended")
    return 0


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m service.console",
        description=(
            "Serve the operator console (EXPIRY_CONSOLE_HOST:EXPIRY_CONSOLE_PORT, localhost "
            "by default); print the hash of a password for EXPIRY_CONSOLE_USERS; list the "
            "open sessions; end sessions."
        ),
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser("serve", help="serve the console (the default)")
    commands.add_parser("hash-password", help="print a password's hash (read from stdin)")
    listing = commands.add_parser("sessions", help="list the open sessions")
    listing.add_argument("--json", action="store_true", help="as JSON")
    ending = commands.add_parser(
        "end-sessions", help="end an operator's sessions (and sessions by number) at once"
    )
    ending.add_argument("operators", nargs="*", metavar="OPERATOR", help="whose sessions end")
    ending.add_argument(
        "--id", action="append", default=[], type=int, metavar="N", help="a session's number"
    )
    ending.add_argument(
        "--operator", help="who ends them (required; one of EXPIRY_REPLAY_OPERATORS)"
    )
    parser.set_defaults(command="serve")
    run_command(parser, serve)


if __name__ == "__main__":
    main()
