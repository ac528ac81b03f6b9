"""An in-process asyncio TCP proxy that tests use to cut or blackhole a service."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from enum import Enum
from urllib.parse import urlsplit, urlunsplit


class Mode(Enum):
    """How the proxy treats traffic."""

    FORWARD = "forward"
    RESET = "reset"  # live connections closed, new ones closed at once
    BLACKHOLE = "blackhole"  # connections stay open, nothing is forwarded


class TcpProxy:
    """Forwards 127.0.0.1:<port> to a target; ``cut()``, ``blackhole()``, ``restore()``."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.mode = Mode.FORWARD
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.accepted = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._on_client, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def url(self, url: str) -> str:
        """``url`` with its host and port replaced by the proxy's."""
        parts = urlsplit(url)
        userinfo = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        return urlunsplit(parts._replace(netloc=f"{userinfo}127.0.0.1:{self.port}"))

    def cut(self) -> None:
        """Close every live connection and refuse new ones (a crash or a reset)."""
        self.mode = Mode.RESET
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    def blackhole(self) -> None:
        """Keep connections open but forward nothing (a partition)."""
        self.mode = Mode.BLACKHOLE

    def restore(self) -> None:
        """Forward again (connections cut meanwhile stay cut)."""
        self.mode = Mode.FORWARD

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.mode is Mode.RESET:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(src, dst))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                while self.mode is Mode.BLACKHOLE:
                    await asyncio.sleep(0.05)
                if self.mode is Mode.RESET:
                    break
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(dst)
            dst.transport.abort()


@contextlib.asynccontextmanager
async def tcp_proxy(url: str, default_port: int) -> AsyncIterator[TcpProxy]:
    """A started proxy in front of the service at ``url``."""
    parts = urlsplit(url)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or default_port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()
