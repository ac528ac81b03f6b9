"""An in-process asyncio TCP proxy that tests use to inject network faults.

``cut()`` resets every connection and refuses new ones (a crash or a reset);
``blackhole()`` keeps connections open but forwards nothing, in either
direction, and hides closes until ``restore()`` (a partition: what was sent
arrives after the heal, or the connection turns out to be dead); ``delay``
adds latency to every chunk. An *inspector* sees the client's bytes before
they are forwarded and can arm one connection to lose the server's next reply
(``cut_on_reply``) or to hold the server's replies forever (``hold_replies``);
the fault suite's inspectors, which read the PostgreSQL and AMQP wire, are in
``tests/faults/netproxy.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from enum import Enum
from typing import Any
from urllib.parse import urlsplit, urlunsplit


class Mode(Enum):
    """How the proxy treats traffic."""

    FORWARD = "forward"
    RESET = "reset"  # live connections closed, new ones closed at once
    BLACKHOLE = "blackhole"  # connections stay open, nothing is forwarded


@dataclass(eq=False)
class Link:
    """One proxied connection."""

    number: int
    opened_at: float
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter | None = None
    client_closed_at: float | None = None
    hold_replies: bool = False
    cut_on_reply: bool = False
    closed: bool = False

    def abort(self) -> None:
        """Reset both sides."""
        self.closed = True
        self.client.transport.abort()
        if self.server is not None:
            self.server.transport.abort()


Inspector = Callable[[Link, bytes], None]


@dataclass(eq=False)
class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target``; see the module docstring."""

    target: tuple[str, int]
    inspector: Inspector | None = None
    delay: float = 0.0
    mode: Mode = Mode.FORWARD
    port: int = 0
    links: list[Link] = field(default_factory=list)
    cut_links: int = 0
    _server: asyncio.Server | None = None
    _passable: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self) -> None:
        """Listen on a free local port."""
        self._passable.set()
        self._server = await asyncio.start_server(self._on_client, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def url(self, url: str) -> str:
        """``url`` with its host and port replaced by the proxy's."""
        parts = urlsplit(url)
        userinfo = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        return urlunsplit(parts._replace(netloc=f"{userinfo}127.0.0.1:{self.port}"))

    def cut(self) -> None:
        """Reset every live connection and refuse new ones."""
        self.mode = Mode.RESET
        self._passable.set()
        for link in self.links:
            if not link.closed:
                self.cut_links += 1
                link.abort()

    def blackhole(self) -> None:
        """Forward nothing and hide closes, until ``restore()``."""
        self.mode = Mode.BLACKHOLE
        self._passable.clear()

    def restore(self) -> None:
        """Forward again (connections cut meanwhile stay cut)."""
        self.mode = Mode.FORWARD
        self._passable.set()

    def opened_since(self, moment: float) -> list[Link]:
        """Connections accepted at or after ``moment`` (``time.monotonic()``)."""
        return [link for link in self.links if link.opened_at >= moment]

    async def close(self) -> None:
        """Stop listening and reset everything."""
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = Link(len(self.links) + 1, time.monotonic(), writer)
        self.links.append(link)
        if self.mode is Mode.RESET:
            link.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            link.abort()
            return
        link.server = up_writer
        self._spawn(self._pump(link, reader, up_writer, upstream=True))
        self._spawn(self._pump(link, up_reader, writer, upstream=False))

    async def _read_into(
        self,
        link: Link,
        src: asyncio.StreamReader,
        queue: asyncio.Queue[bytes | None],
        upstream: bool,
    ) -> None:
        with contextlib.suppress(OSError):
            while data := await src.read(65536):
                queue.put_nowait(data)
        if upstream and link.client_closed_at is None:
            link.client_closed_at = time.monotonic()
        queue.put_nowait(None)

    async def _pump(
        self, link: Link, src: asyncio.StreamReader, dst: asyncio.StreamWriter, *, upstream: bool
    ) -> None:
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        reader = asyncio.create_task(self._read_into(link, src, queue, upstream))
        try:
            while (data := await queue.get()) is not None:
                await self._passable.wait()
                if self.mode is Mode.RESET or link.closed:
                    break
                if upstream and self.inspector is not None:
                    self.inspector(link, data)
                if not upstream and link.cut_on_reply:
                    self.cut_links += 1
                    break
                if not upstream and link.hold_replies:
                    await asyncio.Event().wait()  # held until the link is torn down
                if self.delay:
                    await asyncio.sleep(self.delay)
                if link.closed:
                    break
                dst.write(data)
                await dst.drain()
        except OSError:
            pass
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            link.abort()


@contextlib.asynccontextmanager
async def tcp_proxy(
    url: str, default_port: int, inspector: Inspector | None = None
) -> AsyncIterator[TcpProxy]:
    """A started proxy in front of the service at ``url``."""
    parts = urlsplit(url)
    proxy = TcpProxy((parts.hostname or "127.0.0.1", parts.port or default_port), inspector)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()
