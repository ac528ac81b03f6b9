"""A running ``python -m service.console`` for the console's tests, with three operators:
alice and bob may replay and close (EXPIRY_REPLAY_OPERATORS), eve may only look, assign
and note."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx

from service.console.auth import hash_password
from tests.acceptance.processes import start, stop
from tests.support import Stack, eventually, free_port

PASSWORDS = {"alice": "alice-secret-password", "bob": "bob-secret-password", "eve": "eve-pw-123456"}
CSRF = re.compile(r'name="csrf" value="([^"]+)"')
_HASHES: dict[str, str] = {}


def users() -> str:
    """EXPIRY_CONSOLE_USERS for the three (hashed once per test run)."""
    if not _HASHES:
        _HASHES.update({name: hash_password(pw) for name, pw in PASSWORDS.items()})
    return ",".join(f"{name}:{hashed}" for name, hashed in _HASHES.items())


@dataclass
class Console:
    """Where the console listens."""

    base: str
    port: int = 0

    def client(self) -> httpx.AsyncClient:
        """A browser-like client: its own cookie jar, no redirects followed."""
        return httpx.AsyncClient(base_url=self.base, timeout=30)


async def csrf_of(client: httpx.AsyncClient, path: str) -> str:
    """The CSRF token of the forms on ``path``."""
    found = CSRF.search((await client.get(path)).text)
    assert found is not None, f"no form on {path}"
    return found.group(1)


async def log_in(client: httpx.AsyncClient, name: str) -> None:
    """Log ``name`` in (its session cookie stays in the client)."""
    token = await csrf_of(client, "/login")
    answer = await client.post(
        "/login", data={"csrf": token, "name": name, "password": PASSWORDS[name]}
    )
    assert answer.status_code == 303, answer.text


@contextlib.asynccontextmanager
async def running_console(stack: Stack, **env: str) -> AsyncIterator[Console]:
    """``python -m service.console`` against the test's stack, until the block ends."""
    port = free_port()
    process = await start(
        "service.console",
        env=stack.env(
            **{
                "EXPIRY_CONSOLE_PORT": str(port),
                "EXPIRY_CONSOLE_USERS": users(),
                "EXPIRY_CONSOLE_SECRET": "a-test-secret-that-is-long-enough-0123456789",
                "EXPIRY_REPLAY_OPERATORS": "alice,bob",
                **env,
            }
        ),
    )
    console = Console(f"http://127.0.0.1:{port}", port)

    async def answers() -> bool:
        if process.returncode is not None:
            raise AssertionError(f"the console exited {process.returncode}")
        try:
            async with console.client() as client:
                return (await client.get("/login")).status_code == 200
        except httpx.TransportError:
            return False

    try:
        await eventually(answers, timeout=30, every=0.2)
        yield console
    finally:
        code, output = await stop(process)
        await asyncio.sleep(0)
        assert code == 0, output[-3000:]
