"""Fixtures of the fault scenarios: one private RabbitMQ node per session (a vhost per
scenario), one private PostgreSQL cluster per session (only when a scenario asks for
it), and a world per scenario. Prints every scenario's figures at the end."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from tests import pooler
from tests.faults.nodes import PgCluster
from tests.faults.report import RESULTS
from tests.faults.world import World, open_world
from tests.pooler import Pooler
from tests.rabbitnode import FaultNode, Rabbitmq4Node, RabbitNode, ServerUnavailable
from tests.support import Endpoints, missing

T = TypeVar("T")


def _or_missing(what: str, step: Callable[[], T], undo: Callable[[], object] = lambda: None) -> T:
    """``step()``; if a private server cannot be set up, ``undo()`` what it left and skip
    (fail under CI) saying that ``what`` is missing."""
    try:
        return step()
    except ServerUnavailable as exc:
        undo()
        missing(f"no {what}: {exc}")


@pytest.fixture(scope="session")
def rabbit_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultNode]:
    """The suite's broker node: a private node of the machine's rabbitmq-server on ports
    of its own (stopped and removed afterwards), or with ``FAULTS_RABBITMQ=4`` the
    RabbitMQ 4.x node of ``../shared/tools/rabbitmq4.sh`` (left running)."""
    node: RabbitNode | Rabbitmq4Node = _or_missing(
        "private RabbitMQ node",
        lambda: (
            Rabbitmq4Node()
            if os.environ.get("FAULTS_RABBITMQ", "") == "4"
            else RabbitNode.alone(tmp_path_factory.mktemp("rabbit"))
        ),
    )
    _or_missing("RabbitMQ node for the fault suite", node.start, node.shutdown)
    yield node
    node.shutdown()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    """A private PostgreSQL cluster on a port of its own; dropped afterwards."""
    cluster = _or_missing("private PostgreSQL cluster", PgCluster)
    _or_missing("private PostgreSQL cluster", cluster.create, cluster.drop)
    yield cluster
    cluster.drop()


@pytest.fixture(scope="session")
def machine_pooler(endpoints: Endpoints) -> Iterator[Pooler | None]:
    """In the pooler leg (``TEST_POOLER=pgbouncer``), PgBouncer in front of the machine's
    PostgreSQL; else None."""
    if not pooler.wanted():
        yield None
        return
    with pooler.running_pgbouncer(endpoints.database_url) as running:
        yield running


@pytest.fixture(scope="session")
def cluster_pooler(pg_cluster: PgCluster) -> Iterator[Pooler | None]:
    """In the pooler leg, PgBouncer in front of the private cluster (it stays up while
    the cluster stops and starts); else None."""
    if not pooler.wanted():
        yield None
        return
    with pooler.running_pgbouncer(pg_cluster.admin_url) as running:
        yield running


@pytest.fixture
async def world(
    endpoints: Endpoints,
    rabbit_node: FaultNode,
    tmp_path: Path,
    machine_pooler: Pooler | None,
) -> AsyncIterator[World]:
    """A database on the machine's PostgreSQL (in the pooler leg, reached through
    PgBouncer) and a vhost on the private node."""
    async with open_world(
        endpoints.database_url, rabbit_node, tmp_path, pooler=machine_pooler
    ) as opened:
        yield opened


@pytest.fixture
async def pg_world(
    pg_cluster: PgCluster, rabbit_node: FaultNode, tmp_path: Path, cluster_pooler: Pooler | None
) -> AsyncIterator[World]:
    """A database on the private PostgreSQL cluster (in the pooler leg, reached through
    PgBouncer) and a vhost on the private node."""
    async with open_world(
        pg_cluster.admin_url, rabbit_node, tmp_path, pg_cluster, pooler=cluster_pooler
    ) as opened:
        yield opened


@pytest.fixture
async def failover_world(
    rabbit_node: FaultNode, tmp_path: Path
) -> AsyncIterator[tuple[World, PgCluster, PgCluster]]:
    """A primary and its streaming replica (private clusters of their own, dropped
    afterwards), a database on the primary (replicated), a vhost on the private node."""
    primary, replica = PgCluster(), PgCluster()

    def create_both() -> None:
        primary.create()
        replica.create_replica_of(primary)

    def drop_both() -> None:
        replica.drop()
        primary.drop()

    _or_missing("private PostgreSQL primary and replica", create_both, drop_both)
    try:
        async with open_world(primary.admin_url, rabbit_node, tmp_path, primary) as opened:
            yield opened, primary, replica
    finally:
        replica.drop()
        primary.drop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Every scenario's figures, one line each."""
    if not RESULTS:
        return
    terminalreporter.section("fault scenarios: figures")
    for figures in RESULTS:
        terminalreporter.write_line(figures.line())
