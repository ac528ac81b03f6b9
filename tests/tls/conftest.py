"""The TLS servers, started once for the run's TLS tests and removed at its end; the
certificates they and the service use. The servers need the machine's rabbitmq-server and
PostgreSQL's cluster tools (missing: skipped, failed under CI)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.nodes import PgCluster
from tests.rabbitnode import ServerUnavailable
from tests.support import missing
from tests.tls.certs import Certs, make_certs
from tests.tls.servers import TlsRabbitNode, tls_cluster


@pytest.fixture(scope="session")
def tls_certs() -> Iterator[Certs]:
    """The CAs, certificates and keys, in a folder the PostgreSQL server may read."""
    folder = Path(tempfile.mkdtemp(prefix="expiry-tls-"))
    try:
        yield make_certs(folder, owner="postgres")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def tls_broker(tls_certs: Certs) -> Iterator[TlsRabbitNode]:
    """A private RabbitMQ node with an amqps listener and an https API."""
    if shutil.which("rabbitmq-server") is None:
        missing("rabbitmq-server is not installed here: the TLS tests start a node of it")
    home = Path(tempfile.mkdtemp(prefix="expiry-tls-node-"))
    node = TlsRabbitNode.alone(home, prefix="tls")
    assert isinstance(node, TlsRabbitNode)
    node.certs = tls_certs
    try:
        node.start()
    except ServerUnavailable as exc:
        node.shutdown()
        pytest.fail(f"the TLS node did not start: {exc}")
    try:
        yield node
    finally:
        node.shutdown()


@pytest.fixture(scope="session")
def tls_postgres(tls_certs: Certs) -> Iterator[PgCluster]:
    """A private PostgreSQL cluster that takes only TLS with a client certificate."""
    if shutil.which("pg_createcluster") is None:
        missing("pg_createcluster is not installed here: the TLS tests start a cluster")
    cluster = tls_cluster(tls_certs)
    try:
        yield cluster
    finally:
        cluster.drop()
