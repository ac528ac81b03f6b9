"""The benchmark's own database and vhost: created at the start, removed at the end."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any
from urllib.error import HTTPError, URLError
from urllib.parse import quote, unquote, urlsplit, urlunsplit
from urllib.request import Request, urlopen

import asyncpg

from bench.config import MANAGEMENT_PORT, Endpoints, with_path


class Management:
    """The few RabbitMQ management API calls the benchmark makes (run in a thread)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        port = parts.port or MANAGEMENT_PORT
        self.base = urlunsplit(parts._replace(netloc=f"{parts.hostname}:{port}", path="/api"))
        user, password = unquote(parts.username or "guest"), unquote(parts.password or "guest")
        self._auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    def _call(self, method: str, path: str, body: dict[str, str] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = Request(f"{self.base}{path}", data=data, method=method)
        request.add_header("content-type", "application/json")
        request.add_header("authorization", self._auth)
        try:
            with urlopen(request, timeout=30) as response:
                text = response.read()
        except HTTPError as exc:
            raise ConnectionError(f"RabbitMQ management API: {method} {path}: {exc}") from None
        except URLError as exc:
            raise ConnectionError(
                f"cannot reach the RabbitMQ management API at {self.base} ({exc.reason}); "
                "set RABBITMQ_MANAGEMENT_URL"
            ) from None
        return json.loads(text) if text else None

    async def get(self, path: str) -> Any:
        """GET one resource (parsed JSON)."""
        return await asyncio.to_thread(self._call, "GET", path)

    async def create_vhost(self, vhost: str, user: str) -> None:
        """Create ``vhost`` and let ``user`` do anything in it."""
        name = quote(vhost, safe="")
        await asyncio.to_thread(self._call, "PUT", f"/vhosts/{name}", {})
        everything = {"configure": ".*", "write": ".*", "read": ".*"}
        path = f"/permissions/{name}/{quote(user, safe='')}"
        await asyncio.to_thread(self._call, "PUT", path, everything)

    async def delete_vhost(self, vhost: str) -> None:
        """Delete ``vhost`` and everything in it."""
        await asyncio.to_thread(self._call, "DELETE", f"/vhosts/{quote(vhost, safe='')}")


@dataclass(frozen=True)
class Sandbox:
    """One name for the database and the vhost, and the URLs that reach them."""

    name: str
    endpoints: Endpoints
    management: Management

    @property
    def database_url(self) -> str:
        return with_path(self.endpoints.database_url, self.name)

    @property
    def amqp_url(self) -> str:
        return with_path(self.endpoints.amqp_url, self.name)

    @property
    def amqp_user(self) -> str:
        return unquote(urlsplit(self.endpoints.amqp_url).username or "guest")


def new_sandbox(endpoints: Endpoints) -> Sandbox:
    """A fresh name (``bench_<random>``) on the given servers."""
    return Sandbox(f"bench_{secrets.token_hex(4)}", endpoints, Management(endpoints.management_url))


@contextlib.asynccontextmanager
async def created(sandbox: Sandbox, say: Callable[[str], None]) -> AsyncIterator[None]:
    """Create the database and the vhost; remove both afterwards, whatever happened."""
    await admin_sql(sandbox.endpoints.database_url, f'CREATE DATABASE "{sandbox.name}"')
    try:
        await sandbox.management.create_vhost(sandbox.name, sandbox.amqp_user)
        try:
            yield
        finally:
            await sandbox.management.delete_vhost(sandbox.name)
    finally:
        drop = f'DROP DATABASE IF EXISTS "{sandbox.name}" WITH (FORCE)'
        await admin_sql(sandbox.endpoints.database_url, drop)
        say(f"removed the database and the vhost {sandbox.name}")


async def admin_sql(url: str, statement: str) -> None:
    """One statement on the maintenance database (``CREATE`` / ``DROP DATABASE``)."""
    conn = await asyncpg.connect(url, timeout=10)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()
