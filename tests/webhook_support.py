"""A real HTTP receiver on the loopback for the webhook tests (uvicorn and Starlette, in
the test's event loop), the endpoints that point at it, and the deliverer run in-process.

The receiver answers each request with the next of a script of answers (then the last
one again), records each request's headers, body and arrival time, and verifies the
signature with the Standard Webhooks library's own verifier.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from standardwebhooks.webhooks import Webhook, WebhookVerificationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from service.adapters.postgres import deliveries as rows
from service.adapters.postgres import webhook_endpoints
from service.adapters.postgres.pool import Connection
from service.deliver.courier import Courier
from service.deliver.deliverer import run
from service.settings import Endpoint
from tests.support import Stack, pg_connection, running_until_stopped

LOOPBACK = ["127.0.0.0/8"]
BODY_SECRET = "a-response-body-that-must-never-be-kept"


def new_secret() -> str:
    """A fresh endpoint secret, as the contract spells it."""
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


@dataclass(frozen=True)
class Reply:
    """One scripted answer: a status, headers, and a delay before it."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass(frozen=True)
class Received:
    """One request as the receiver saw it."""

    at: float  # time.monotonic()
    path: str
    headers: dict[str, str]
    body: bytes
    verified: bool


@dataclass(eq=False)
class Receiver:
    """The loopback receiver (see the module docstring)."""

    secret: str
    script: list[Reply] = field(default_factory=lambda: [Reply()])
    received: list[Received] = field(default_factory=list)
    port: int = 0
    down: Reply | None = None  # answered instead of the script until ``down_until``
    down_until: float = 0.0

    def down_for(self, seconds: float, reply: Reply) -> None:
        """Answer ``reply`` to every request for the next ``seconds``, then the script."""
        self.down, self.down_until = reply, time.monotonic() + seconds

    def url(self, path: str = "/hook", host: str = "127.0.0.1") -> str:
        """Its URL (plain HTTP on the loopback: allowed by ``LOOPBACK`` only)."""
        return f"http://{host}:{self.port}{path}"

    def endpoint(self, name: str = "orders", **fields: Any) -> Endpoint:
        """An endpoint pointing at it, the loopback allowed."""
        values: dict[str, Any] = {
            "name": name,
            "url": self.url(),
            "secret": self.secret,
            "allow_networks": LOOPBACK,
            "timeout_seconds": 2.0,
        }
        values.update(fields)
        return Endpoint.model_validate(values)

    def ids(self) -> list[str]:
        """The webhook-id of each request, in order."""
        return [request.headers.get("webhook-id", "") for request in self.received]

    async def handle(self, request: Request) -> Response:
        body = await request.body()
        headers = dict(request.headers)
        try:
            Webhook(self.secret).verify(body, headers)
            verified = True
        except WebhookVerificationError:
            verified = False
        self.received.append(Received(time.monotonic(), request.url.path, headers, body, verified))
        if self.down is not None and time.monotonic() < self.down_until:
            reply = self.down
        else:
            reply = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if reply.delay:
            await asyncio.sleep(reply.delay)
        return Response(BODY_SECRET, status_code=reply.status, headers=reply.headers)


@contextlib.asynccontextmanager
async def receiving(script: Sequence[Reply] = (Reply(),)) -> AsyncIterator[Receiver]:
    """A receiver listening on 127.0.0.1 (a free port) until the block ends."""
    receiver = Receiver(new_secret(), list(script))
    app = Starlette(routes=[Route("/{path:path}", receiver.handle, methods=["POST", "GET"])])
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    receiver.port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        yield receiver
    finally:
        server.should_exit = True
        async with asyncio.timeout(10):
            await task
        sock.close()


def delivering(stack: Stack, *endpoints: Endpoint, **overrides: Any) -> Stack:
    """The stack with these endpoints and quick retries and pauses."""
    values: dict[str, Any] = {
        "webhooks": endpoints,
        "webhook_poll_seconds": 0.1,
        "webhook_backoff_seconds": 0.2,
        "webhook_backoff_cap_seconds": 1.0,
        "webhook_lease_seconds": 10.0,
    }
    values.update(overrides)
    return stack.with_settings(**values)


async def register(stack: Stack) -> None:
    """The stack's endpoints registered (as the deliverer does at its start), so that the
    events written from now on have their deliveries."""
    async with pg_connection(stack.database_url) as conn:
        await webhook_endpoints.register(
            conn, [endpoint.name for endpoint in stack.settings.webhooks]
        )


def running_deliverer(stack: Stack) -> AbstractAsyncContextManager[asyncio.Task[list[Courier]]]:
    """An in-process deliverer (the real ``run``), stopped as SIGTERM would on leaving."""
    return running_until_stopped(lambda stop: run(stack.settings, stop))


async def deliveries(stack: Stack) -> list[dict[str, Any]]:
    """The delivery rows as they stand (those not delivered yet, and the dead)."""
    async with pg_connection(stack.database_url) as conn:
        found = await conn.fetch(
            "SELECT endpoint, message_id, attempts, dead, last_status, last_error"
            " FROM webhook_deliveries ORDER BY id"
        )
    return [dict(row) for row in found]


async def dead_letters(stack: Stack) -> list[dict[str, Any]]:
    """Every dead-letter record, every column, as text (for what must not be in it)."""
    async with pg_connection(stack.database_url) as conn:
        found = await conn.fetch("SELECT * FROM dead_letters ORDER BY id")
    return [dict(row) for row in found]


def as_text(records: list[dict[str, Any]]) -> str:
    """Records as one text, to look for what must not be kept."""
    return json.dumps(records, default=str)


def attempted(
    endpoint: str, message_id: str, status: int | None = 200, error_class: str | None = None
) -> rows.Attempted:
    """An attempt as a deliverer records it when it settles one (for the tests that settle
    by hand)."""
    return rows.Attempted(
        endpoint=endpoint,
        message_id=message_id,
        number=1,
        kind=rows.AUTOMATIC,
        status=status,
        error_class=error_class,
        duration_ms=1.5,
        deliverer="test",
    )


async def claimed(
    conn: Connection, endpoint: str, wanted: int, *, lease_seconds: float, token: uuid.UUID
) -> list[rows.Delivery]:
    """Up to ``wanted`` due deliveries leased to ``token``, as a deliverer claims them, the
    rate limit out of the way (a million a second fills the bucket within microseconds,
    however slow the statements before)."""
    claim = await rows.claim(
        conn,
        endpoint,
        wanted,
        rate=1_000_000,
        burst=float(wanted),
        probe_seconds=30,
        lease_seconds=lease_seconds,
        token=token,
    )
    return claim.deliveries


async def attempts(stack: Stack) -> list[dict[str, Any]]:
    """The attempt log, oldest first."""
    async with pg_connection(stack.database_url) as conn:
        found = await conn.fetch(
            "SELECT endpoint, message_id, attempt, kind, status, error_class, deliverer"
            " FROM webhook_attempts ORDER BY id"
        )
    return [dict(row) for row in found]
