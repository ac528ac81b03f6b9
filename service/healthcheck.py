"""``python -m service.healthcheck``: can this container's service do its work?

The container's ``HEALTHCHECK``: exit 0 only if, within the timeout, a
connection opens to at least one PostgreSQL host of ``DATABASE_URL`` (TCP, or
the unix socket of a socket directory; asyncpg's defaults when the URL names
no host; several hosts are failover candidates, so one is enough) and to at
least one RabbitMQ node of ``AMQP_URL`` (the service uses the first reachable
one), and, when the process serves its HTTP endpoint (``EXPIRY_HTTP_PORT``,
the consumers), only if ``GET /readyz`` answers 200: the consumer is attached,
its channel open and its database pool answering. It needs no extra tooling
in the image.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass
from urllib.parse import urlsplit

from service.cli import positive_seconds, run_command
from service.core.dsn import parse_dsn
from service.core.redaction import redact
from service.settings import Settings, process_environment

DEFAULT_PORTS = {"amqp": 5672, "amqps": 5671}
DEFAULT_TIMEOUT_SECONDS = 3.0


@dataclass(frozen=True)
class Target:
    """One ``host:port`` to open a TCP connection to, or a unix socket (``path``)."""

    what: str
    host: str
    port: int
    path: str | None = None

    def __str__(self) -> str:
        if self.path is not None:
            return f"{self.what} at {self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.what} at {host}:{self.port}"


def target(what: str, url: str) -> Target:
    """The host and port named by a (validated) AMQP URL."""
    parts = urlsplit(url)
    return Target(what, parts.hostname or "localhost", parts.port or DEFAULT_PORTS[parts.scheme])


def database_targets(url: str) -> list[Target]:
    """Every host asyncpg would try for a (validated) ``DATABASE_URL``, in its order."""
    return [
        Target("PostgreSQL", host.address, host.port, host.socket_path)
        for host in parse_dsn(url, process_environment()).hosts
    ]


async def reach(where: Target, timeout: float) -> str | None:
    """Open and close a connection; return why it failed, or None."""
    try:
        async with asyncio.timeout(timeout):
            if where.path is not None:
                _reader, writer = await asyncio.open_unix_connection(where.path)
            else:
                _reader, writer = await asyncio.open_connection(where.host, where.port)
    except TimeoutError:
        return f"no answer within {timeout:g}s"
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    writer.close()
    await writer.wait_closed()
    return None


async def reach_any(targets: list[Target], timeout: float) -> list[str]:
    """Nothing when one of ``targets`` answers; else why each did not."""
    errors = await asyncio.gather(*(reach(each, timeout) for each in targets))
    if any(error is None for error in errors):
        return []
    return [f"cannot reach {each}: {error}" for each, error in zip(targets, errors, strict=True)]


def readiness_target(settings: Settings) -> Target | None:
    """The process's own HTTP endpoint, if it serves one."""
    if not settings.http_port:
        return None
    host = settings.http_host if settings.http_host not in ("", "0.0.0.0", "::") else "127.0.0.1"
    return Target("the readiness endpoint", host, settings.http_port)


async def ready(where: Target, timeout: float) -> str | None:
    """``GET /readyz``; return why it is not 200, or None."""
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(where.host, where.port)
            writer.write(f"GET /readyz HTTP/1.0\r\nHost: {where.host}\r\n\r\n".encode())
            response = await reader.read(4096)
    except TimeoutError:
        return f"no answer within {timeout:g}s"
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    writer.close()
    head, _, body = response.decode("latin-1").partition("\r\n\r\n")
    status_line = head.splitlines()[0] if head else ""
    if status_line.split(" ")[1:2] == ["200"]:
        return None
    return " ".join(body.split()) or status_line or "no response"


async def check(settings: Settings, timeout: float, *, broker: bool = True) -> list[str]:
    """Problems found: empty when a database host, a broker node (unless ``broker`` is
    False: a process that never connects to one) and readiness are fine."""
    database = database_targets(settings.database_url)
    nodes = [target("RabbitMQ", url) for url in settings.amqp_url] if broker else []
    database_problems, node_problems = await asyncio.gather(
        reach_any(database, timeout), reach_any(nodes, timeout)
    )
    problems = database_problems + node_problems
    endpoint = readiness_target(settings)
    if endpoint is not None and (not_ready := await ready(endpoint, timeout)) is not None:
        problems.append(f"not ready ({endpoint}): {not_ready}")
    return problems


async def _main(settings: Settings, args: argparse.Namespace) -> int:
    problems = await check(settings, args.timeout, broker=not args.no_broker)
    if problems:
        print(redact(f"unhealthy: {'; '.join(problems)}"), flush=True)
        return 1
    ready_too = " and /readyz answers 200" if readiness_target(settings) else ""
    servers = "PostgreSQL is" if args.no_broker else "PostgreSQL and RabbitMQ are"
    print(f"healthy: {servers} reachable{ready_too}", flush=True)
    return 0


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m service.healthcheck",
        description=(
            "Exit 0 only if a connection opens to a PostgreSQL host of DATABASE_URL and "
            "to a RabbitMQ node of AMQP_URL, and, when EXPIRY_HTTP_PORT is set, GET /readyz "
            "answers 200 (the container's HEALTHCHECK)."
        ),
    )
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        default=DEFAULT_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help=f"per connection (default {DEFAULT_TIMEOUT_SECONDS:g})",
    )
    parser.add_argument(
        "--no-broker",
        action="store_true",
        help="do not look for RabbitMQ: for a process that never connects to it "
        "(python -m service.deliver)",
    )
    run_command(parser, _main)


if __name__ == "__main__":
    main()
