"""How every command opens what it needs and closes it again, whatever happens.

Context managers for the database (one connection or a pool), the broker (the
first node of ``AMQP_URL`` that answers, with failover), SIGTERM/SIGINT and
telemetry; a command composes the ones it needs with an ``AsyncExitStack``.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, TypeVar

from aio_pika.abc import AbstractRobustConnection
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from service.adapters import amqp, pid1, postgres, telemetry
from service.settings import Settings

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class _Closable(Protocol):
    async def close(self) -> None: ...


C = TypeVar("C", bound=_Closable)


@contextlib.asynccontextmanager
async def _closed_at_end(opening: Awaitable[C]) -> AsyncIterator[C]:
    opened = await opening
    try:
        yield opened
    finally:
        await opened.close()


def database(
    settings: Settings, *, name: str
) -> contextlib.AbstractAsyncContextManager[postgres.PlainConnection]:
    """One PostgreSQL connection (``application_name`` ``name``), closed at the end."""
    return _closed_at_end(postgres.connect(settings, application_name=name))


def database_pool(
    settings: Settings, *, name: str, size: int
) -> contextlib.AbstractAsyncContextManager[postgres.Pool]:
    """A PostgreSQL pool of at most ``size`` connections, closed at the end."""
    return _closed_at_end(postgres.create_pool(settings, application_name=name, size=size))


def broker(
    settings: Settings, *, name: str
) -> contextlib.AbstractAsyncContextManager[AbstractRobustConnection]:
    """A robust connection to the first node of ``AMQP_URL`` that answers, closed at the end."""
    return _closed_at_end(amqp.connect(settings, name=name))


@contextlib.contextmanager
def stop_on_signals(
    stop: asyncio.Event, *, also: Callable[[], None] | None = None
) -> Iterator[asyncio.Event]:
    """SIGTERM and SIGINT set ``stop`` (and call ``also``) until the block ends; so does a
    SIGTERM that reached the process as PID 1 before (``service/pid1.py``)."""
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        stop.set()
        if also is not None:
            also()

    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, on_signal)
    if pid1.stop_requested():
        on_signal()
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
def telemetry_for(
    settings: Settings, role: str, *, metrics: bool = False, long_lived: bool = False
) -> Iterator[Telemetry]:
    """Tracing (and metrics, for a process that serves or pushes them), flushed at the end.

    ``long_lived``: its span export process is ready before the work starts (see
    ``telemetry.setup_tracing``); a short command starts at once, beside it.
    """
    installed = Telemetry(
        telemetry.setup_tracing(settings, role, export_ready=long_lived),
        telemetry.setup_metrics(settings, role) if metrics else None,
    )
    try:
        yield installed
    finally:
        telemetry.shutdown(installed.tracing, installed.meters)
