"""DATABASE_URL forms against the real PostgreSQL: failover hosts, session attributes, sockets."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import pytest

from service import healthcheck
from service.adapters import postgres
from service.core.dsn import parse_dsn
from tests.support import Endpoints, stack_settings

pytestmark = pytest.mark.integration

SOCKET_DIRECTORY = "/var/run/postgresql"


def _multi_host(url: str, query: str = "") -> str:
    """``url`` with a closed port (127.0.0.1:1) tried before its own host."""
    parts = urlsplit(url)
    userinfo, _, hostport = parts.netloc.rpartition("@")
    credentials = f"{userinfo}@" if userinfo else ""
    return f"postgresql://{credentials}127.0.0.1:1,{hostport}{parts.path}{query}"


def _socket_url(url: str) -> str:
    """The same database over the local unix socket (skips when there is none)."""
    parts = urlsplit(url)
    port = parts.port or 5432
    if not os.path.exists(f"{SOCKET_DIRECTORY}/.s.PGSQL.{port}"):
        pytest.skip(f"no PostgreSQL socket in {SOCKET_DIRECTORY} for port {port}")
    user = parts.username or "postgres"
    return f"postgresql://{parts.path}?host={SOCKET_DIRECTORY}&port={port}&user={user}"


@pytest.fixture(params=["failover", "read-write", "socket"])
def database_url(request: pytest.FixtureRequest, endpoints: Endpoints) -> str:
    """One DATABASE_URL form naming the test run's PostgreSQL."""
    if request.param == "failover":
        return _multi_host(endpoints.database_url)
    if request.param == "read-write":
        return _multi_host(endpoints.database_url, "?target_session_attrs=read-write")
    return _socket_url(endpoints.database_url)


async def test_connect_uses_a_host_that_answers(endpoints: Endpoints, database_url: str) -> None:
    """db.connect gets past a closed first host, honours read-write, and uses sockets."""
    settings = stack_settings(database_url, endpoints.amqp_url)
    conn = await postgres.connect(settings, application_name="expiry-test-dsn")
    try:
        assert await conn.fetchval("SELECT 1") == 1
        assert await conn.fetchval("SELECT pg_is_in_recovery()") is False
    finally:
        await conn.close()


async def test_pool_uses_a_host_that_answers(endpoints: Endpoints, database_url: str) -> None:
    """db.create_pool opens its connections the same way."""
    settings = stack_settings(database_url, endpoints.amqp_url)
    pool = await postgres.create_pool(settings, application_name="expiry-test-dsn", size=2)
    try:
        assert await pool.fetchval("SELECT 1") == 1
    finally:
        await pool.close()


async def test_healthcheck_accepts_the_url(endpoints: Endpoints, database_url: str) -> None:
    """The health check probes every host and is content when one of them answers."""
    targets = healthcheck.database_targets(database_url)
    assert len(targets) == len(parse_dsn(database_url).hosts)
    assert await healthcheck.reach_any(targets, 3.0) == []
    settings = stack_settings(database_url, endpoints.amqp_url)
    assert await healthcheck.check(settings, 3.0) == []


async def test_healthcheck_reports_every_host_when_none_answers() -> None:
    """With no host answering, each one is named with its reason."""
    url = "postgresql://u@127.0.0.1:1,127.0.0.1:2/db?target_session_attrs=read-write"
    problems = await healthcheck.reach_any(healthcheck.database_targets(url), 3.0)
    assert [problem.split(":")[0] for problem in problems] == [
        "cannot reach PostgreSQL at 127.0.0.1",
        "cannot reach PostgreSQL at 127.0.0.1",
    ]
    assert "127.0.0.1:1:" in problems[0]
    assert "127.0.0.1:2:" in problems[1]


async def test_healthcheck_without_the_broker_asks_only_for_the_database(
    endpoints: Endpoints,
) -> None:
    """--no-broker (the deliverer's, which never connects to RabbitMQ): a broker that does
    not answer is no problem; a database that does not is one."""
    nowhere = "amqp://guest:guest@127.0.0.1:1/"
    settings = stack_settings(endpoints.database_url, nowhere)
    assert await healthcheck.check(settings, 3.0, broker=False) == []
    [problem] = await healthcheck.check(settings, 3.0)
    assert problem.startswith("cannot reach RabbitMQ at 127.0.0.1:1")
    gone = stack_settings("postgresql://u@127.0.0.1:1/db", nowhere)
    [problem] = await healthcheck.check(gone, 3.0, broker=False)
    assert problem.startswith("cannot reach PostgreSQL at 127.0.0.1")
