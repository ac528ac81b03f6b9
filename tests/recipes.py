"""Recipes several tests share: the consumer's database behind a proxy the test cuts,
and a consumer running while it is cut (``seeding.py``, the fault, telemetry and
hostile-input tests); a setting refused in one line (the settings' unit tests)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from service.core.errors import ConfigError
from service.scan import scan_once
from service.settings import Settings, load_settings
from tests.proxy import TcpProxy, tcp_proxy
from tests.support import Stack, running_consumer, wait_for_consumers


@dataclass(frozen=True)
class ProxiedDatabase:
    """A proxy in front of the stack's PostgreSQL, and settings that reach it through it."""

    proxy: TcpProxy
    settings: Settings


@contextlib.asynccontextmanager
async def database_behind_proxy(stack: Stack, **overrides: Any) -> AsyncIterator[ProxiedDatabase]:
    """The stack's settings with ``overrides``, their database reached through a proxy."""
    async with tcp_proxy(stack.database_url, 5432) as proxy:
        update = {"database_url": proxy.url(stack.database_url), **overrides}
        yield ProxiedDatabase(proxy, stack.settings.model_copy(update=update))


@contextlib.asynccontextmanager
async def consumer_cut_off(
    stack: Stack, database: ProxiedDatabase, *, scan: bool = True
) -> AsyncIterator[asyncio.Task[None]]:
    """A consumer on ``database``'s settings, attached to the work queue; then its
    database cut and, with ``scan``, the due holds published by a scan that reaches the
    database directly. Stopped on leaving, as SIGTERM would."""
    async with running_consumer(database.settings) as task:
        await wait_for_consumers(stack.amqp_url, 1, task)
        database.proxy.cut()
        if scan:
            await scan_once(stack.settings)
        yield task


def assert_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    """With ``name`` set to ``value``, ``load_settings`` raises one ``ConfigError`` line
    that starts with ``message``."""
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)
