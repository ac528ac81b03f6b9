"""Root fixtures: a clean environment, and a private database and vhost per test.

The private database and vhost are a sandbox (``service/demo/workspace.py``,
as the demo and the benchmark use): the database is a copy of a migrated
template. ``stack``'s vhost holds the service's topology, declared as the
deploy does (``service.declare``), since the running processes only check it;
``bare_stack``'s vhost is empty.

Every test runs with the library patches a command gets at its start from
``service.cli.run_command`` (``service/adapters/amqp/internals.py``: the total
decoders), since many run the service's parts in-process.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from service.adapters.amqp import internals
from service.adapters.postgres.databases import create_database, drop_database
from service.adapters.postgres.schema import migrate
from service.declare import declare
from service.demo.workspace import sandbox_created
from tests import pooler
from tests.pooler import Pooler
from tests.support import (
    RUN_ID,
    Endpoints,
    Management,
    Stack,
    resolve_endpoints,
    stack_settings,
    without_credentials,
)

_counter = itertools.count(1)


@pytest.fixture(scope="session", autouse=True)
def _library_patches() -> None:
    """What ``run_command`` installs before a command runs (the total decoders)."""
    internals.install()


# Settings read without the EXPIRY_ prefix that a test run's shell sets for the fixtures.
_SHELL_ONLY = ("RABBITMQ_MANAGEMENT_URL",)


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No EXPIRY_* from the shell, and no stray .env file, can leak into a test."""
    for name in list(os.environ):
        if name.startswith("EXPIRY_") or name in _SHELL_ONLY:
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="session")
def endpoints() -> Iterator[Endpoints]:
    """The real PostgreSQL and RabbitMQ of this run."""
    with resolve_endpoints() as found:
        yield found


@pytest.fixture(scope="session")
def template_database(endpoints: Endpoints) -> Iterator[str]:
    """A migrated database that each test's database is cloned from."""
    name = f"expiry_tmpl_{RUN_ID}"
    url = asyncio.run(create_database(endpoints.database_url, name))
    asyncio.run(migrate(stack_settings(url, endpoints.amqp_url)))
    yield name
    asyncio.run(drop_database(endpoints.database_url, name))


@pytest.fixture(scope="session")
def stack_pooler(endpoints: Endpoints) -> Iterator[Pooler | None]:
    """In the pooler leg (``TEST_POOLER=pgbouncer``: ``tests/pooler.py``), PgBouncer in
    front of the machine's PostgreSQL, which every stack's settings then go through;
    else None."""
    if not pooler.wanted():
        yield None
        return
    with pooler.running_pgbouncer(endpoints.database_url) as running:
        yield running


@contextlib.asynccontextmanager
async def _private_stack(
    endpoints: Endpoints, template_database: str, through: Pooler | None
) -> AsyncIterator[Stack]:
    """A private, migrated database and an empty private vhost; removed afterwards. The
    stack's settings reach the database ``through`` the pooler when there is one; its
    ``database_url`` (the test's own reads) goes straight to the server."""
    number = next(_counter)
    management = Management(endpoints.management_url)
    async with sandbox_created(
        endpoints.database_url,
        (endpoints.amqp_url,),
        management,
        database=f"expiry_t_{RUN_ID}_{number}",
        vhost=f"expiry-t-{RUN_ID}-{number}",
        template=template_database,
        lenient=True,  # a vhost gone already, or its node down, is left alone
    ) as box:
        # The management API of this run's broker, with the credentials of AMQP_URL.
        management_url = without_credentials(endpoints.management_url)
        settings = stack_settings(box.database_url, box.amqp_url, management_url=management_url)
        if through is not None:
            settings = settings.model_copy(
                update={
                    "database_url": through.url_for(box.database_url),
                    "db_pooler": "transaction",
                }
            )
        yield Stack(
            database_url=box.database_url,
            amqp_url=box.amqp_url,
            vhost=box.vhost,
            management=management,
            settings=settings,
        )


@pytest.fixture
async def stack(
    endpoints: Endpoints, template_database: str, stack_pooler: Pooler | None
) -> AsyncIterator[Stack]:
    """A private, migrated database and a private vhost holding the declared topology."""
    async with _private_stack(endpoints, template_database, stack_pooler) as opened:
        await declare(opened.settings)
        yield opened


@pytest.fixture
async def bare_stack(
    endpoints: Endpoints, template_database: str, stack_pooler: Pooler | None
) -> AsyncIterator[Stack]:
    """A private, migrated database and an empty private vhost (nothing declared)."""
    async with _private_stack(endpoints, template_database, stack_pooler) as opened:
        yield opened
