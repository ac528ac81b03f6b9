"""Entry point of ``python -m service.console`` (serve) and ``... hash-password``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import logging
import sys
from collections.abc import Iterator

import uvicorn

from service.adapters import lifecycle
from service.cli import run_command
from service.console import auth
from service.console.app import create_app
from service.core.errors import UsageError
from service.settings import Settings

log = logging.getLogger("service.console")


async def serve(settings: Settings, args: argparse.Namespace) -> int:
    """Serve the console until SIGTERM or SIGINT (uvicorn's own handlers)."""
    if args.command == "hash-password":
        return hash_password()
    if not settings.console_users and not settings.console_trusted_header:
        raise UsageError(
            "nobody could log in: set EXPIRY_CONSOLE_USERS (python -m service.console "
            "hash-password) or EXPIRY_CONSOLE_TRUSTED_HEADER"
        )
    if settings.console_secret is None:
        log.warning("console.ephemeral_secret")  # sessions end when the console restarts
    config = uvicorn.Config(
        create_app(settings),
        host=settings.console_host,
        port=settings.console_port,
        log_config=None,
        access_log=False,
        server_header=False,
        proxy_headers=False,
        lifespan="on",
    )
    log.info(
        "console.listening",
        extra={"host": settings.console_host, "port": settings.console_port},
    )
    server = ConsoleServer(config)
    with lifecycle.stop_on_signals(asyncio.Event(), also=server.stop):
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


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m service.console",
        description=(
            "Serve the operator console (EXPIRY_CONSOLE_HOST:EXPIRY_CONSOLE_PORT, localhost "
            "by default), or print the hash of a password for EXPIRY_CONSOLE_USERS."
        ),
    )
    parser.add_argument("command", nargs="?", choices=("serve", "hash-password"), default="serve")
    run_command(parser, serve)


if __name__ == "__main__":
    main()
