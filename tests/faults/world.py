"""One scenario's world: its own database, its own vhost on the private node, its processes."""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from tests.faults.checks import install_transition_trigger
from tests.faults.nodes import PgCluster
from tests.faults.services import Fleet, ServiceProcess
from tests.rabbitnode import RabbitNode
from tests.support import Management

RUN = secrets.token_hex(3)
_numbers = itertools.count(1)

RETRY_DELAYS = (1, 2, 4)

# Short budgets so that a scenario's retries happen within seconds; everything
# else is the service's default.
SERVICE_ENV = {
    "EXPIRY_RETRY_DELAYS": ",".join(str(d) for d in RETRY_DELAYS),
    "EXPIRY_MAX_ATTEMPTS": "10",
    "EXPIRY_MAX_AGE_SECONDS": "300",
    "EXPIRY_LOCK_TIMEOUT_MS": "1000",
    "EXPIRY_STATEMENT_TIMEOUT_MS": "5000",
    "EXPIRY_DB_CONNECT_TIMEOUT_SECONDS": "2",
    "EXPIRY_PUBLISH_TIMEOUT_SECONDS": "5",
    "EXPIRY_HEARTBEAT_SECONDS": "5",
    "EXPIRY_SHUTDOWN_TIMEOUT_SECONDS": "20",
    "EXPIRY_LOG_FORMAT": "json",
    "EXPIRY_LOG_LEVEL": "INFO",
}


def with_database(url: str, name: str) -> str:
    """``url`` pointing at database ``name``."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


@dataclass
class World:
    """A scenario's private database and vhost, its processes and its log directory."""

    name: str
    database_url: str
    admin_url: str
    vhost: str
    node: RabbitNode
    management: Management
    workdir: Path
    fleet: Fleet
    cluster: PgCluster | None = None
    retry_delays: tuple[int, ...] = RETRY_DELAYS
    names: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def amqp_url(self) -> str:
        """The scenario's vhost on the private node, directly."""
        return self.node.amqp_url(self.vhost)

    def env(self, **overrides: str) -> dict[str, str]:
        """Environment of a service process of this world (``overrides`` win)."""
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith("EXPIRY_") and key not in ("DATABASE_URL", "AMQP_URL")
        }
        env.update(SERVICE_ENV)
        env.update(
            DATABASE_URL=self.database_url,
            AMQP_URL=self.amqp_url,
            # The private node's management API (the credentials are AMQP_URL's).
            EXPIRY_MANAGEMENT_URL=self.node.management_url,
            PYTHONUNBUFFERED="1",
        )
        env.update(overrides)
        return env

    async def declare(self) -> ServiceProcess:
        """Run ``python -m service.declare`` (the deploy's step) to completion."""
        return await self.fleet.run("service.declare", name="declare", env=self.env())

    async def consumer(self, name: str | None = None, **overrides: str) -> ServiceProcess:
        """Start ``python -m service.consume``."""
        name = name or f"consumer{next(self.names)}"
        env = self.env(EXPIRY_WORKER_ID=name, **overrides)
        return await self.fleet.start("service.consume", name=name, env=env)

    async def scanner(self, every: float = 1.0, **overrides: str) -> ServiceProcess:
        """Start ``python -m service.produce --every SECONDS``."""
        env = self.env(EXPIRY_WORKER_ID="scanner", **overrides)
        return await self.fleet.start(
            "service.produce", "--every", str(every), name="scanner", env=env
        )

    async def scan(self, timeout: float = 120.0, /, **overrides: str) -> ServiceProcess:
        """Run ``python -m service.produce --scan`` to completion."""
        env = self.env(EXPIRY_WORKER_ID="scan", **overrides)
        return await self.fleet.run(
            "service.produce", "--scan", name="scan", env=env, timeout=timeout
        )

    @property
    def retry_queues(self) -> list[str]:
        """The delay queues of this world's tiers."""
        return [f"expirations.retry.{delay}s" for delay in self.retry_delays]


async def _admin(url: str, statement: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def open_world(
    admin_url: str, node: RabbitNode, workdir: Path, cluster: PgCluster | None = None
) -> AsyncIterator[World]:
    """Create the database (migrated by ``python -m service.migrate``) and the vhost, with
    the topology declared by ``python -m service.declare``, as a deploy does."""
    number = next(_numbers)
    name = f"faults_{RUN}_{number}"
    vhost = f"faults-{RUN}-{number}"
    await _admin(admin_url, f"CREATE DATABASE {name}")
    management = Management(node.management_url)
    world = World(
        name=name,
        database_url=with_database(admin_url, name),
        admin_url=admin_url,
        vhost=vhost,
        node=node,
        management=management,
        workdir=workdir,
        fleet=Fleet(workdir),
        cluster=cluster,
    )
    try:
        await management.create_vhost(vhost)
        migrate = await world.fleet.run("service.migrate", name="migrate", env=world.env())
        assert migrate.returncode == 0, migrate.text()
        declare = await world.declare()
        assert declare.returncode == 0, declare.text()
        await install_transition_trigger(world.database_url)
        yield world
    finally:
        await world.fleet.reap()
        await management.delete_vhost(vhost)
        if cluster is not None and not cluster.is_running():
            cluster.start()
        await _admin(admin_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
