"""Fixtures of the cluster test: a private three-node RabbitMQ cluster per module, and a
vhost on it and a private database (cloned from the migrated template) per test."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterator

import pytest

from service.adapters.postgres.databases import database_created
from tests.cluster.nodes import RabbitCluster, new_cluster
from tests.cluster.observe import TRIGGER_SQL, create_vhost, execute
from tests.cluster.report import RESULTS
from tests.rabbitnode import ServerUnavailable
from tests.support import RUN_ID, Endpoints, missing

_numbers = itertools.count(1)


@pytest.fixture(scope="module")
def rabbit_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitCluster]:
    """Three private RabbitMQ nodes joined into one cluster; torn down whatever happens."""
    try:
        cluster = new_cluster(tmp_path_factory.mktemp("rabbit-cluster"))
    except ServerUnavailable as exc:
        missing(f"no private RabbitMQ cluster: {exc}")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.shutdown()


@pytest.fixture
async def cluster_vhost(rabbit_cluster: RabbitCluster) -> str:
    """A vhost of its own on the cluster, every node running (a node that an earlier test
    took away is brought back first). Left in place: the cluster goes with the module."""
    await asyncio.to_thread(rabbit_cluster.restore)
    vhost = f"cluster-{RUN_ID}-{next(_numbers)}"
    await create_vhost(rabbit_cluster.nodes[0], vhost)
    return vhost


@pytest.fixture
async def cluster_database(endpoints: Endpoints, template_database: str) -> AsyncIterator[str]:
    """A migrated database of its own with the transition-counting trigger; dropped after."""
    name = f"expiry_cluster_{RUN_ID}_{next(_numbers)}"
    async with database_created(endpoints.database_url, name, template=template_database) as url:
        await execute(url, TRIGGER_SQL)
        yield url


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Every run's figures, again at the end."""
    if not RESULTS:
        return
    terminalreporter.section("cluster test: figures")
    for figures in RESULTS:
        for line in figures.lines():
            terminalreporter.write_line(line)
        terminalreporter.write_line("")
