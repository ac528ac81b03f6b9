"""A private database and vhost for one run: created, then removed.

The demo, the benchmark and the tests work in a sandbox of their own so that
they never touch anyone's data: a database beside the one an admin URL names
(``CREATE DATABASE``, optionally a copy of a template) and a vhost made through
the management API, in which the AMQP user may do anything. At the end the
vhost and then the database are removed, whatever happened, unless ``keep``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import asyncpg

from service.adapters.amqp.management import Management, ManagementUnavailable
from service.core.dsn import with_database
from service.core.redaction import redact

ADMIN_TIMEOUT_SECONDS = 10.0


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


def with_vhost(amqp_url: str, vhost: str) -> str:
    """``amqp_url`` pointing at ``vhost``."""
    return urlunsplit(urlsplit(amqp_url)._replace(path=f"/{quote(vhost, safe='')}"))


def amqp_user(amqp_url: str) -> str:
    """The user an AMQP URL logs in as (guest when it names none)."""
    return unquote(urlsplit(amqp_url).username or "guest")


def _identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def admin_sql(admin_url: str, statement: str) -> None:
    """One statement on a connection of its own (``CREATE`` or ``DROP DATABASE``)."""
    try:
        conn = await asyncpg.connect(admin_url, timeout=ADMIN_TIMEOUT_SECONDS)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        raise ConnectionError(redact(f"cannot reach PostgreSQL at {admin_url}: {exc}")) from None
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


async def create_database(admin_url: str, name: str, *, template: str | None = None) -> str:
    """Create database ``name`` on ``admin_url``'s server (a copy of ``template``); its URL."""
    copy = f" TEMPLATE {_identifier(template)}" if template else ""
    await admin_sql(admin_url, f"CREATE DATABASE {_identifier(name)}{copy}")
    return with_database(admin_url, name)


async def drop_database(admin_url: str, name: str) -> None:
    """Drop database ``name`` if it exists, ending its sessions."""
    await admin_sql(admin_url, f"DROP DATABASE IF EXISTS {_identifier(name)} WITH (FORCE)")


@contextlib.asynccontextmanager
async def database_created(
    admin_url: str, name: str, *, template: str | None = None, keep: bool = False
) -> AsyncIterator[str]:
    """Database ``name`` (its URL) for the block; dropped afterwards unless ``keep``."""
    url = await create_database(admin_url, name, template=template)
    try:
        yield url
    finally:
        if not keep:
            await drop_database(admin_url, name)


@contextlib.asynccontextmanager
async def vhost_created(
    management: Management, name: str, *, user: str, keep: bool = False, lenient: bool = False
) -> AsyncIterator[None]:
    """Vhost ``name``, where ``user`` may do anything, for the block; deleted afterwards
    unless ``keep`` (``lenient``: one that cannot be deleted, its node down, is left)."""
    await management.create_vhost(name, user)
    try:
        yield
    finally:
        if not keep:
            try:
                await management.delete_vhost(name)
            except ManagementUnavailable:
                if not lenient:
                    raise


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
