"""HTTP/1.1 connections to one endpoint for the webhooks, kept alive: at most ``size`` in
use at once (a request waits for one), the idle ones kept for the next requests.

Each request is written in one send, its head and its body, and its answer read with
h11 (as the service's own HTTP endpoint reads requests, ``server.py``): the status and
the headers, then the body up to ``BODY_READ_LIMIT``, thrown away. A redirect is never
followed: it is a status like any other. A connection is kept for the next request only
when both sides are done with this one and neither asked to close it (past the body's
bound, or on any error or a cancellation, it is closed); an idle one that the server has
closed meanwhile is dropped before use. Connections open through the SSRF guard
(``guarded_network.py``), and never through a proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import ssl
from collections.abc import Sequence
from dataclasses import dataclass

import h11

from service.adapters.http.guarded_network import Admit, Streams, connect

# What is read of a response's body, at most, before the connection is dropped: enough
# for a small answer to leave the connection reusable; the bytes are thrown away.
BODY_READ_LIMIT = 64 * 1024
READ_BYTES = 64 * 1024
MAX_HEAD_BYTES = 100 * 1024  # a response's status line and headers
CLOSE_SECONDS = 1.0  # closing the idle connections, at the end

Headers = Sequence[tuple[bytes, bytes]]


class ReadError(Exception):
    """The connection failed, or was closed, before the whole answer was read."""


@dataclass(frozen=True)
class Answered:
    """A response: its status and headers (the body is never kept)."""

    status: int
    headers: Headers


class Connection:
    """One HTTP/1.1 connection, one request after the other."""

    def __init__(self, streams: Streams) -> None:
        self.reader, self.writer = streams
        self.protocol = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)

    def open(self) -> bool:
        """Still usable for a request: not closed, nor written to, by the server."""
        if self.reader.at_eof() or self.writer.is_closing():
            return False
        sock = self.writer.get_extra_info("socket")
        if sock is None or sock.fileno() < 0:
            return False
        poll = select.poll()  # readable while idle: its end, or bytes nobody asked for
        poll.register(sock.fileno(), select.POLLIN)
        return not poll.poll(0)

    async def exchange(self, request: h11.Request, body: bytes) -> Answered:
        """Send ``request`` and ``body``, read the answer; then ready for the next one, or
        closed."""
        protocol = self.protocol
        sent = [protocol.send(part) for part in (request, h11.Data(data=body), h11.EndOfMessage())]
        self.writer.write(b"".join(part for part in sent if part))
        await self.writer.drain()
        event = await self._next()
        while isinstance(event, h11.InformationalResponse):  # 1xx: the answer follows
            event = await self._next()
        if not isinstance(event, h11.Response):
            raise ReadError(f"no response but {type(event).__name__}")
        read = 0
        while not isinstance(part := await self._next(), h11.EndOfMessage):
            if isinstance(part, h11.Data):
                read += len(part.data)
                if read > BODY_READ_LIMIT:  # not read to its end: the connection goes
                    self.close()
                    break
        else:
            done = protocol.our_state is h11.DONE and protocol.their_state is h11.DONE
            if done and not protocol.trailing_data[0]:  # nothing more was sent: reusable
                protocol.start_next_cycle()
            else:
                self.close()
        return Answered(event.status_code, list(event.headers))

    async def _next(self) -> h11.Event:
        """The answer's next event, reading as it needs."""
        while True:
            event = self.protocol.next_event()
            if isinstance(event, h11.ConnectionClosed):
                raise ReadError("the server closed the connection")
            if isinstance(event, h11.Event):
                return event
            if event is h11.PAUSED:  # (not before the answer's end)
                raise ReadError("more than the answer was sent")
            try:
                data = await self.reader.read(READ_BYTES)
            except OSError as exc:
                raise ReadError(type(exc).__name__) from exc
            self.protocol.receive_data(data)  # b"": the server closed it

    @property
    def idle(self) -> bool:
        """Ready for another request."""
        return self.protocol.our_state is h11.IDLE and not self.writer.is_closing()

    def close(self) -> None:
        """Closed (in the background: nothing waits for the server's end of it)."""
        self.writer.close()


class Connections:
    """An endpoint's connections (``host``, ``port``, TLS with ``tls``), opened through
    the guard's ``admit``; at most ``size`` in use at once."""

    def __init__(
        self, host: str, port: int, tls: ssl.SSLContext | None, admit: Admit, size: int
    ) -> None:
        self._host, self._port, self._tls, self._admit = host, port, tls, admit
        self._slots = asyncio.Semaphore(size)
        self._idle: list[Connection] = []

    async def request(self, request: h11.Request, body: bytes) -> Answered:
        """Send one request on an idle connection, or a new one; its answer."""
        async with self._slots:
            connection = self._reused() or Connection(
                await connect(self._host, self._port, self._admit, self._tls)
            )
            try:
                answered = await connection.exchange(request, body)
            except BaseException:  # failed, timed out, cancelled: never used again
                connection.close()
                raise
            if connection.idle:
                self._idle.append(connection)
            return answered

    def _reused(self) -> Connection | None:
        while self._idle:
            connection = self._idle.pop()
            if connection.open():
                return connection
            connection.close()
        return None

    async def close(self) -> None:
        """Close the idle connections (those in use close with their request)."""
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(CLOSE_SECONDS):
                await asyncio.gather(
                    *(connection.writer.wait_closed() for connection in idle),
                    return_exceptions=True,
                )
