"""Test support: where the real services are, per-test isolation, small helpers.

Services come from ``DATABASE_URL`` / ``AMQP_URL`` / ``RABBITMQ_MANAGEMENT_URL``
when set, else from the contract's local defaults when those answer, else from
testcontainers where a Docker engine runs. Otherwise the tests that need them
skip with a reason, except under ``CI=true``, where a missing service fails.
The management API client and the URL helpers are the service's own
(``service/adapters/amqp/management.py``, ``service/demo/workspace.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any, NoReturn, TypeVar
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import asyncpg
import httpx
import pytest

# Re-exported: many tests import them from here.
from service.adapters.amqp.management import Management as Management
from service.adapters.amqp.management import url_beside
from service.adapters.amqp.queues import QueueCounts, queue_counts
from service.adapters.amqp.vhosts import with_vhost as with_vhost
from service.core.dsn import with_database as with_database
from service.settings import Settings

T = TypeVar("T")

DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
RUN_ID = uuid.uuid4().hex[:8]
REPO = Path(__file__).resolve().parents[1]
# Read once, before any test clears it: it is also a setting (EXPIRY_MANAGEMENT_URL's alias).
SHELL_MANAGEMENT_URL = os.environ.get("RABBITMQ_MANAGEMENT_URL")


@dataclass(frozen=True)
class Endpoints:
    """The admin endpoints of the real services used by this test run."""

    database_url: str  # a maintenance database: tests create their own beside it
    amqp_url: str  # its vhost is replaced by each test's own
    management_url: str  # http://user:pass@host:port


def _reachable(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection(
            (parts.hostname or "localhost", parts.port or default_port), 2
        ):
            return True
    except OSError:
        return False


def without_credentials(url: str) -> str:
    """``url`` without its user and password: the service then logs in with its own."""
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=netloc))


def as_role(url: str, role: str) -> str:
    """``url`` logging in as ``role`` (no password: a trusting server, or a .pgpass)."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{role}@{host}"))


def _docker_available() -> bool:
    if shutil.which("docker") is None:
        return False
    probe = subprocess.run(["docker", "info"], capture_output=True, check=False, timeout=20)
    return probe.returncode == 0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def missing(reason: str) -> NoReturn:
    """Skip, or fail under CI, because a service is missing."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


def run_module(
    module: str, *args: str, env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m module args`` to completion from the repository root (output captured);
    ``start_module`` starts one in the background."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


async def start_module(
    module: str,
    *args: str,
    env: dict[str, str],
    output: IO[bytes],
    cwd: Path = REPO,
    stdin: int | None = None,
) -> asyncio.subprocess.Process:
    """Start ``python -m module args`` in the background, its stdout and stderr to ``output``."""
    command = [sys.executable, "-m", module, *args]
    return await asyncio.create_subprocess_exec(
        *command, env=env, cwd=cwd, stdin=stdin, stdout=output, stderr=output
    )


@contextlib.contextmanager
def resolve_endpoints() -> Iterator[Endpoints]:
    """Find the services (see the module docstring); yield their endpoints."""
    database_url = os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL
    amqp_url = (os.environ.get("AMQP_URL") or DEFAULT_AMQP_URL).split(",")[0]
    management_url = SHELL_MANAGEMENT_URL or url_beside(amqp_url)
    if _reachable(database_url, 5432) and _reachable(amqp_url, 5672):
        yield Endpoints(database_url, amqp_url, management_url)
        return
    if not _docker_available():
        missing(
            "PostgreSQL and RabbitMQ are not reachable (set DATABASE_URL and AMQP_URL, "
            "or start them) and no Docker engine runs for testcontainers"
        )
    with _containers() as endpoints:
        yield endpoints


@contextlib.contextmanager
def _containers() -> Iterator[Endpoints]:
    from testcontainers.postgres import PostgresContainer
    from testcontainers.rabbitmq import RabbitMqContainer

    with (
        PostgresContainer("postgres:16-alpine", driver=None) as pg,
        RabbitMqContainer("rabbitmq:4.0-management") as rmq,
    ):
        host = rmq.get_container_host_ip()
        amqp = f"amqp://guest:guest@{host}:{rmq.get_exposed_port(5672)}/"
        mgmt = f"http://guest:guest@{host}:{rmq.get_exposed_port(15672)}"
        yield Endpoints(pg.get_connection_url(), amqp, mgmt)


@dataclass(frozen=True)
class Stack:
    """One test's private database and vhost, and the settings that use them."""

    database_url: str
    amqp_url: str
    vhost: str
    management: Management
    settings: Settings

    def with_settings(self, **overrides: Any) -> Stack:
        """The same stack with some settings changed."""
        return replace(self, settings=self.settings.model_copy(update=overrides))

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for ``python -m service.*`` subprocesses against this stack."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("EXPIRY_")}
        env.update(
            DATABASE_URL=self.settings.database_url,
            AMQP_URL=",".join(self.settings.amqp_url),
            EXPIRY_RETRY_DELAYS=",".join(str(d) for d in self.settings.retry_delays),
            EXPIRY_RETRY_JITTER=repr(self.settings.retry_jitter),
            EXPIRY_RETRY_JITTER_SLOTS=str(self.settings.retry_jitter_slots),
            EXPIRY_LOG_FORMAT="json",
            PYTHONUNBUFFERED="1",
        )
        if self.settings.management_url is not None:
            env.update(EXPIRY_MANAGEMENT_URL=self.settings.management_url)
        if self.settings.db_pooler != "none":
            env.update(EXPIRY_DB_POOLER=self.settings.db_pooler)
        env.update(extra)
        return env


def stack_settings(database_url: str, amqp_url: str, **overrides: Any) -> Settings:
    """Settings for one test: short delays and budgets so that retries are quick."""
    values: dict[str, Any] = {
        "database_url": database_url,
        "amqp_url": (amqp_url,),
        "retry_delays": (1, 2),
        # One delay queue per tier: every test declares its topology, and the slot queues
        # of jittered retries would add to each; the tests of jitter set it themselves.
        "retry_jitter": 0.0,
        "max_attempts": 5,
        "max_age_seconds": 120,
        "lock_timeout_ms": 1000,
        "statement_timeout_ms": 5000,
        "db_connect_timeout_seconds": 2.0,
        # The default: it bounds connecting too, and a loaded 2-core host running a browser
        # once kept RabbitMQ 4's greeting back for over 5 s (CI, leg 2).
        "publish_timeout_seconds": 10.0,
        "heartbeat_seconds": 5,
        "shutdown_timeout_seconds": 10.0,
        "log_format": "text",
        "worker_id": f"test-{RUN_ID}",
    }
    values.update(overrides)
    return Settings(**values)


async def eventually(
    check: Callable[[], Awaitable[bool]], *, timeout: float = 30.0, every: float = 0.1
) -> None:
    """Wait until ``check()`` is true, or fail after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(every)


async def until_ready(http: httpx.AsyncClient, *, timeout: float = 30.0) -> None:
    """Wait until a process's ``/readyz`` answers 200 (not listening yet counts as no)."""

    async def ready() -> bool:
        try:
            return (await http.get("/readyz")).status_code == 200
        except httpx.TransportError:
            return False

    await eventually(ready, timeout=timeout)


@contextlib.asynccontextmanager
async def running_until_stopped(
    work: Callable[[asyncio.Event], Coroutine[Any, Any, T]],
) -> AsyncIterator[asyncio.Task[T]]:
    """``work`` in a task (a process's real ``run``, in-process), stopped as SIGTERM would
    on leaving; what made it fail, if it did, is raised then."""
    stop = asyncio.Event()
    task = asyncio.create_task(work(stop))
    try:
        yield task
    finally:
        stop.set()
        async with asyncio.timeout(60):
            await task


async def _declared(amqp_url: str, queue: str) -> QueueCounts:
    """The broker's figures for ``queue`` (``ChannelNotFoundEntity`` if there is none)."""
    connection = await aio_pika.connect(amqp_url)
    try:
        return await queue_counts(await connection.channel(), queue)
    finally:
        await connection.close()


async def queue_depth(amqp_url: str, queue: str) -> int:
    """Ready messages in ``queue``."""
    return (await _declared(amqp_url, queue)).ready


async def drain_queue(amqp_url: str, queue: str) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """Take (and ack) every ready message of ``queue``."""
    taken: list[aio_pika.abc.AbstractIncomingMessage] = []
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        q = await channel.get_queue(queue)
        while (message := await q.get(fail=False, timeout=5)) is not None:
            await message.ack()
            taken.append(message)
    finally:
        await connection.close()
    return taken


@contextlib.asynccontextmanager
async def pg_connection(url: str) -> AsyncIterator[asyncpg.Connection[asyncpg.Record]]:
    """A plain connection for the test's own reads and writes."""
    conn = await asyncpg.connect(url)
    try:
        yield conn
    finally:
        await conn.close()


INSERT_HOLDS = """
INSERT INTO reservations (id, hold_until)
SELECT gen_random_uuid(), now() + make_interval(secs => $2)
  FROM generate_series(1, $1)
RETURNING id
"""


async def insert_holds(url: str, count: int, *, due_in: float = -1.0) -> list[uuid.UUID]:
    """Insert ``count`` held reservations due ``due_in`` seconds from the database's now."""
    async with pg_connection(url) as conn:
        rows = await conn.fetch(INSERT_HOLDS, count, due_in)
    return [row["id"] for row in rows]


async def statuses(url: str) -> dict[str, int]:
    """Reservations by status."""
    async with pg_connection(url) as conn:
        rows = await conn.fetch("SELECT status, count(*) AS n FROM reservations GROUP BY 1")
    return {row["status"]: row["n"] for row in rows}


async def transitions_per_reservation(url: str) -> dict[uuid.UUID, int]:
    """How many audited transitions each reservation has."""
    async with pg_connection(url) as conn:
        rows = await conn.fetch(
            "SELECT reservation_id, count(*) AS n FROM reservation_transitions GROUP BY 1"
        )
    return {row["reservation_id"]: row["n"] for row in rows}


async def publish_raw(
    amqp_url: str,
    bodies: list[bytes],
    *,
    message_ids: list[str] | None = None,
    headers: dict[str, Any] | None = None,
) -> None:
    """Publish raw bodies to the ``expirations`` exchange with confirms."""
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        exchange = await channel.get_exchange("expirations")
        for index, body in enumerate(bodies):
            message = aio_pika.Message(
                body,
                content_type="application/json",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                message_id=message_ids[index] if message_ids else None,
                headers=headers,
            )
            await exchange.publish(message, "expire", mandatory=True)
    finally:
        await connection.close()


async def consumer_count(amqp_url: str, queue: str = "expirations") -> int:
    """Consumers attached to ``queue``."""
    return (await _declared(amqp_url, queue)).consumers


@contextlib.asynccontextmanager
async def running_consumer(settings: Settings, **options: Any) -> AsyncIterator[asyncio.Task[None]]:
    """An in-process consumer (the real ``process.run``), stopped as SIGTERM would."""
    from service.worker import process

    stop = asyncio.Event()
    task = asyncio.create_task(process.run(settings, stop, **options))
    try:
        yield task
    finally:
        stop.set()
        async with asyncio.timeout(60):
            await task


async def wait_for_consumers(
    amqp_url: str, count: int, task: asyncio.Task[None] | None = None
) -> None:
    """Wait until ``count`` consumers are attached (and fail early if ``task`` died)."""

    async def attached() -> bool:
        if task is not None and task.done():
            task.result()
        try:
            return await consumer_count(amqp_url) >= count
        except aio_pika.exceptions.ChannelNotFoundEntity:
            return False

    await eventually(attached, timeout=30)


@contextlib.asynccontextmanager
async def attached_consumer(
    stack: Stack, settings: Settings | None = None, **options: Any
) -> AsyncIterator[asyncio.Task[None]]:
    """``running_consumer`` on ``settings`` (by default the stack's) with ``options``, once
    it is attached to the stack's work queue."""
    settings = stack.settings if settings is None else settings
    async with running_consumer(settings, **options) as task:
        await wait_for_consumers(stack.amqp_url, 1, task)
        yield task
