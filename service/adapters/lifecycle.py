"""How every command opens what it needs and closes it again, whatever happens.

Context managers for the database (one connection or a pool), the broker (the
first node of ``AMQP_URL`` that answers, with failover), SIGTERM/SIGINT and
telemetry; a command composes the ones it needs with an ``AsyncExitStack``.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

from aio_pika.abc import AbstractRobustConnection
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from service.adapters import amqp, postgres, telemetry
from service.settings import Settings

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.asynccontextmanager
async def database(settings: Settings, *, name: str) -> AsyncIterator[postgres.PlainConnection]:
    """One PostgreSQL connection (``application_name`` ``name``), closed at the end."""
    conn = await postgres.connect(settings, application_name=name)
    try:
        yield conn
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def database_pool(
    settings: Settings, *, name: str, size: int
) -> AsyncIterator[postgres.Pool]:
    """A PostgreSQL pool of at most ``size`` connections, closed at the end."""
    pool = await postgres.create_pool(settings, application_name=name, size=size)
    try:
        yield pool
    finally:
        await pool.close()


@contextlib.asynccontextmanager
async def broker(settings: Settings, *, name: str) -> AsyncIterator[AbstractRobustConnection]:
    """A robust connection to the first node of ``AMQP_URL`` that answers, closed at the end."""
    connection = await amqp.connect(settings, name=name)
    try:
        yield connection
    finally:
        await connection.close()


@contextlib.contextmanager
def stop_on_signals(
    stop: asyncio.Event, *, also: Callable[[], None] | None = None
) -> Iterator[asyncio.Event]:
    """SIGTERM and SIGINT set ``stop`` (and call ``also``) until the block ends."""
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        stop.set()
        if also is not None:
            also()

    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, on_signal)
    try:
        yield stop
    finally:
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)


@dataclass(frozen=True)
class Telemetry:
    """What ``telemetry_for`` installed (``None``: off)."""

    tracing: TracerProvider | None
    meters: MeterProvider | None


@contextlib.contextmanager
def telemetry_for(settings: Settings, role: str, *, metrics: bool = False) -> Iterator[Telemetry]:
    """Tracing (and metrics, for a process that serves or pushes them), flushed at the end."""
    installed = Telemetry(
        telemetry.setup_tracing(settings, role),
        telemetry.setup_metrics(settings, role) if metrics else None,
    )
    try:
        yield installed
    finally:
        telemetry.shutdown(installed.tracing, installed.meters)
