"""Root fixtures: a clean environment, and a private database and vhost per test.

``stack``'s vhost holds the service's topology, declared as the deploy does
(``service.declare``), since the running processes only check it;
``bare_stack``'s vhost is empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from service.adapters.postgres.schema import migrate
from service.declare import declare
from tests.support import (
    RUN_ID,
    Endpoints,
    Management,
    Stack,
    resolve_endpoints,
    stack_settings,
    with_database,
    with_vhost,
    without_credentials,
)

_counter = itertools.count(1)


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No EXPIRY_* from the shell, and no stray .env file, can leak into a test."""
    for name in list(os.environ):
        if name.startswith("EXPIRY_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="session")
def endpoints() -> Iterator[Endpoints]:
    """The real PostgreSQL and RabbitMQ of this run."""
    with resolve_endpoints() as found:
        yield found


async def _sql(url: str, *statements: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def template_database(endpoints: Endpoints) -> Iterator[str]:
    """A migrated database that each test's database is cloned from."""
    name = f"expiry_tmpl_{RUN_ID}"
    asyncio.run(_sql(endpoints.database_url, f"CREATE DATABASE {name}"))
    url = with_database(endpoints.database_url, name)
    asyncio.run(migrate(stack_settings(url, endpoints.amqp_url)))
    yield name
    asyncio.run(_sql(endpoints.database_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


@contextlib.asynccontextmanager
async def _private_stack(endpoints: Endpoints, template_database: str) -> AsyncIterator[Stack]:
    """A private, migrated database and an empty private vhost; removed afterwards."""
    number = next(_counter)
    name = f"expiry_t_{RUN_ID}_{number}"
    vhost = f"expiry-t-{RUN_ID}-{number}"
    await _sql(endpoints.database_url, f"CREATE DATABASE {name} TEMPLATE {template_database}")
    management = Management(endpoints.management_url)
    await management.create_vhost(vhost)
    database_url = with_database(endpoints.database_url, name)
    amqp_url = with_vhost(endpoints.amqp_url, vhost)
    # The management API of this run's broker, with the credentials of AMQP_URL.
    management_url = without_credentials(endpoints.management_url)
    try:
        yield Stack(
            database_url=database_url,
            amqp_url=amqp_url,
            vhost=vhost,
            management=management,
            settings=stack_settings(database_url, amqp_url, management_url=management_url),
        )
    finally:
        await management.delete_vhost(vhost)
        await _sql(endpoints.database_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
async def stack(endpoints: Endpoints, template_database: str) -> AsyncIterator[Stack]:
    """A private, migrated database and a private vhost holding the declared topology."""
    async with _private_stack(endpoints, template_database) as opened:
        await declare(opened.settings)
        yield opened


@pytest.fixture
async def bare_stack(endpoints: Endpoints, template_database: str) -> AsyncIterator[Stack]:
    """A private, migrated database and an empty private vhost (nothing declared)."""
    async with _private_stack(endpoints, template_database) as opened:
        yield opened
