"""Recipes several tests share: the consumer's database behind a proxy the test cuts,
and a consumer running while it is cut (``seeding.py``, the fault, telemetry and
hostile-input tests); a consumer running beside a transaction the test holds open
(the batch, pipeline and fault tests)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import asyncpg
from asyncpg.transaction import Transaction

from service.scan import scan_once
from service.settings import Settings
from tests.proxy import TcpProxy, tcp_proxy
from tests.support import Stack, attached_consumer, pg_connection


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
    async with attached_consumer(stack, database.settings) as task:
        database.proxy.cut()
        if scan:
            await scan_once(stack.settings)
        yield task


class HeldOpen(NamedTuple):
    """The test's own connection, the transaction it holds open there, and the consumer."""

    connection: asyncpg.Connection[asyncpg.Record]
    transaction: Transaction
    task: asyncio.Task[None]


@contextlib.asynccontextmanager
async def consumer_beside_a_transaction(
    stack: Stack, settings: Settings
) -> AsyncIterator[HeldOpen]:
    """A consumer on ``settings``, attached to the work queue, and a connection of the
    test's own to the stack's database with a transaction started, which the test
    commits or rolls back. On leaving, the consumer stops (as SIGTERM would), then
    the connection closes."""
    async with (
        pg_connection(stack.database_url) as connection,
        attached_consumer(stack, settings) as task,
    ):
        transaction = connection.transaction()
        await transaction.start()
        yield HeldOpen(connection, transaction, task)
