"""The demo's workspace: its sandbox (a database and a vhost), and the settings that reach it.

A sandbox is a database and a vhost of a run's own, created, then removed whatever
happened: the demo's, and the benchmark's and the tests' too, so that none of them ever
touches anyone's data. The demo names both (``--name``), on the servers that
``DATABASE_URL`` and ``AMQP_URL`` name; the vhost is made through the management API of
the settings (``EXPIRY_MANAGEMENT_URL`` or ``RABBITMQ_MANAGEMENT_URL``, else beside the
first node), as the AMQP URL's user may use it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from service.adapters.amqp.management import Management, ManagementUnavailable, endpoint_for
from service.adapters.amqp.vhosts import amqp_user, vhost_created, with_vhost
from service.adapters.postgres.databases import database_created
from service.core.dsn import with_database
from service.demo.plan import Plan
from service.settings import Settings

# The demo's own sessions (placing up to a million holds, the support side waiting
# for a row lock as any other system would) get longer than a service statement.
OWN_TIMEOUT_MS = 3_600_000
MANAGEMENT_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class Sandbox:
    """A created database and vhost, and the URLs that reach them."""

    database: str
    vhost: str
    database_url: str
    amqp_urls: tuple[str, ...]  # every node of the AMQP URL, each naming the vhost
    management: Management  # the client that made the vhost

    @property
    def amqp_url(self) -> str:
        """The vhost on the first node."""
        return self.amqp_urls[0]


@contextlib.asynccontextmanager
async def sandbox_created(
    admin_url: str,
    amqp_urls: Sequence[str],
    management: Management,
    *,
    database: str,
    vhost: str | None = None,
    template: str | None = None,
    keep: bool = False,
    lenient: bool = False,
) -> AsyncIterator[Sandbox]:
    """Database ``database`` and vhost ``vhost`` (default: the same name), the vhost open to
    the AMQP URL's user, for the block; both removed afterwards unless ``keep``."""
    vhost = vhost or database
    user = amqp_user(amqp_urls[0])
    async with (
        database_created(admin_url, database, template=template, keep=keep) as database_url,
        vhost_created(management, vhost, user=user, keep=keep, lenient=lenient),
    ):
        urls = tuple(with_vhost(url, vhost) for url in amqp_urls)
        yield Sandbox(database, vhost, database_url, urls, management)


def database_url(settings: Settings, plan: Plan) -> str:
    """Where the sandbox's database will be."""
    return with_database(settings.database_url, plan.name)


def amqp_url(settings: Settings, plan: Plan) -> str:
    """Where the sandbox's vhost will be, on the first node."""
    return with_vhost(settings.amqp_url[0], plan.name)


@contextlib.asynccontextmanager
async def sandbox_for(settings: Settings, plan: Plan) -> AsyncIterator[Sandbox]:
    """Create the database and the vhost; remove them afterwards unless ``--keep``."""
    management = endpoint_for(settings).client(MANAGEMENT_TIMEOUT_SECONDS)
    try:
        async with sandbox_created(
            settings.database_url,
            settings.amqp_url,
            management,
            database=plan.name,
            keep=plan.keep,
        ) as sandbox:
            yield sandbox
    except ManagementUnavailable as exc:
        raise ConnectionError(
            f"RabbitMQ management API at {management.base}: {exc}; "
            "set EXPIRY_MANAGEMENT_URL (or RABBITMQ_MANAGEMENT_URL)"
        ) from None


def own_settings(settings: Settings, sandbox: Sandbox) -> Settings:
    """The settings of the demo's own work in the sandbox (its connections, the declare)."""
    return settings.model_copy(
        update={
            "database_url": sandbox.database_url,
            "amqp_url": sandbox.amqp_urls,
            "lock_timeout_ms": OWN_TIMEOUT_MS,
            "statement_timeout_ms": OWN_TIMEOUT_MS,
        }
    )
