"""One scenario's world: its own database, its own vhost on the private node, its processes."""

from __future__ import annotations

import contextlib
import itertools
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from service.core.topology import build_topology
from service.demo.workspace import sandbox_created
from tests.faults.checks import install_transition_trigger
from tests.faults.nodes import PgCluster
from tests.faults.services import (
    RETRY_DELAYS,
    RETRY_JITTER,
    RETRY_JITTER_SLOTS,
    Fleet,
    ServiceProcess,
    service_env,
)
from tests.pooler import Pooler
from tests.rabbitnode import FaultNode
from tests.support import Management

RUN = secrets.token_hex(3)
_numbers = itertools.count(1)


@dataclass
class World:
    """A scenario's private database and vhost, its processes and its log directory."""

    name: str
    database_url: str
    admin_url: str
    vhost: str
    node: FaultNode
    management: Management
    workdir: Path
    fleet: Fleet
    cluster: PgCluster | None = None
    retry_delays: tuple[int, ...] = RETRY_DELAYS
    names: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    extra_env: dict[str, str] = field(default_factory=dict)  # for every service process

    @property
    def amqp_url(self) -> str:
        """The scenario's vhost on the private node, directly."""
        return self.node.amqp_url(self.vhost)

    def env(self, **overrides: str) -> dict[str, str]:
        """Environment of a service process of this world (``overrides`` win); the private
        node's management API, with the credentials of AMQP_URL."""
        overrides = {**self.extra_env, **overrides}
        return service_env(self.database_url, self.amqp_url, self.node.management_url, **overrides)

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
        tiers = build_topology(self.retry_delays, jitter=RETRY_JITTER, slots=RETRY_JITTER_SLOTS)
        return [spec.name for spec in tiers.delay_queues]


@contextlib.asynccontextmanager
async def open_world(
    admin_url: str,
    node: FaultNode,
    workdir: Path,
    cluster: PgCluster | None = None,
    pooler: Pooler | None = None,
) -> AsyncIterator[World]:
    """Create the database (migrated by ``python -m service.migrate``) and the vhost, with
    the topology declared by ``python -m service.declare``, as a deploy does. With a
    ``pooler``, every service process (migrate too) reaches the database through it, as
    ``EXPIRY_DB_POOLER=transaction``; the checks read it directly."""
    number = next(_numbers)
    management = Management(node.management_url)
    async with sandbox_created(
        admin_url,
        (node.amqp_url(),),
        management,
        database=f"faults_{RUN}_{number}",
        vhost=f"faults-{RUN}-{number}",
        lenient=True,  # the node may be down at the end of a scenario
    ) as box:
        world = World(
            name=box.database,
            database_url=box.database_url,
            admin_url=admin_url,
            vhost=box.vhost,
            node=node,
            management=management,
            workdir=workdir,
            fleet=Fleet(workdir),
            cluster=cluster,
        )
        if pooler is not None:
            world.extra_env.update(
                DATABASE_URL=pooler.url_for(box.database_url), EXPIRY_DB_POOLER="transaction"
            )
        try:
            await _deploy(world)
            yield world
        finally:
            await world.fleet.reap()
            if cluster is not None and not cluster.is_running():
                cluster.start()  # to drop the database


async def _deploy(world: World) -> None:
    """Migrate and declare as a deploy does; install the transition counter."""
    migrate = await world.fleet.run("service.migrate", name="migrate", env=world.env())
    assert migrate.returncode == 0, migrate.text()
    declare = await world.declare()
    assert declare.returncode == 0, declare.text()
    await install_transition_trigger(world.database_url)
