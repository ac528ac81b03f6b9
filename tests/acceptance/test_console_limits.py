"""The console's HTTP protocol (service/console/protocol.py) on a real uvicorn server and
raw sockets: an over-long request line is 414 and over-long headers 431, answers the
client reads whole, then a close bounded in time and bytes; other errors stay uvicorn's."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from service.console import protocol
from service.console.guard import SECURITY_HEADERS
from tests.support import free_port

# one_broker: the console's HTTP protocol: no broker at all.
pytestmark = [pytest.mark.acceptance, pytest.mark.one_broker]

LONG_LINE = b"GET /" + b"a" * 1_000_000 + b" HTTP/1.1\r\nhost: console\r\n\r\n"
LONG_HEADERS = (
    b"GET / HTTP/1.1\r\nhost: console\r\n" + (b"x-h: " + b"b" * 95 + b"\r\n") * 2000 + b"\r\n"
)
CHUNK = 64 * 1024


async def tiny_app(scope: Scope, receive: Receive, send: Send) -> None:
    """Reads the whole request body, then answers 200 "ok"."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        more = message.get("more_body", False)
    headers = [(b"content-type", b"text/plain"), (b"content-length", b"3")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok\n"})


@dataclass(frozen=True)
class Served:
    """A uvicorn server on 127.0.0.1, with the console's protocol."""

    port: int
    server: uvicorn.Server

    async def closed_within(self, seconds: float) -> float:
        """Seconds until the server has no connection left; fails past ``seconds``."""
        start = time.monotonic()
        while self.server.server_state.connections:
            assert time.monotonic() - start < seconds, "the server kept the connection"
            await asyncio.sleep(0.02)
        return time.monotonic() - start


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    """A real uvicorn.Server, in this event loop, with the console's protocol and limit."""
    config = uvicorn.Config(
        tiny_app,
        host="127.0.0.1",
        port=free_port(),
        http=protocol.http_protocol(),
        h11_max_incomplete_event_size=protocol.HEADER_LIMIT,
        ws="none",
        log_config=None,
        lifespan="off",
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:
        assert not serving.done(), serving.result()
        await asyncio.sleep(0.01)
    yield Served(config.port, server)
    server.should_exit = True
    await serving


@dataclass(frozen=True)
class Answer:
    """An HTTP answer as the client read it, up to the server's end of stream."""

    status_line: bytes
    headers: dict[bytes, bytes]
    body: bytes

    @classmethod
    def parse(cls, raw: bytes) -> Answer:
        head, _, body = raw.partition(b"\r\n\r\n")
        status_line, *lines = head.split(b"\r\n")
        pairs = (line.split(b":", 1) for line in lines)
        return cls(status_line, {k.lower(): v.strip() for k, v in pairs}, body)


async def read_to_end(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it ends its side."""
    received = bytearray()
    while chunk := await reader.read(CHUNK):
        received += chunk
    return bytes(received)


async def write_all(writer: asyncio.StreamWriter, data: bytes, *, then_eof: bool) -> None:
    """Writes ``data`` in 64 KiB pieces, waiting for each to be taken."""
    for start in range(0, len(data), CHUNK):
        writer.write(data[start : start + CHUNK])
        await writer.drain()
    if then_eof:
        writer.write_eof()


@contextlib.asynccontextmanager
async def connected(
    served: Served,
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A client connection to ``served``, closed afterwards (a reset then is no matter)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def send_and_read(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes, *, then_eof: bool
) -> Answer:
    """Sends all of ``data`` while reading the answer to the end."""
    async with asyncio.timeout(10):
        sending = asyncio.create_task(write_all(writer, data, then_eof=then_eof))
        try:
            raw = await read_to_end(reader)
        finally:
            await sending  # the server read (and dropped) all of it: no reset on the way
    return Answer.parse(raw)


async def answer_to(served: Served, data: bytes, *, then_eof: bool = True) -> Answer:
    """The answer to ``data`` sent on a new connection."""
    async with connected(served) as (reader, writer):
        return await send_and_read(reader, writer, data, then_eof=then_eof)


def assert_answer(answer: Answer, status_line: bytes, body: bytes) -> None:
    assert answer.status_line == status_line
    assert answer.body == body
    assert answer.headers[b"connection"] == b"close"
    assert answer.headers[b"content-type"] == b"text/plain; charset=utf-8"
    assert answer.headers[b"content-length"] == str(len(body)).encode()
    for name, value in SECURITY_HEADERS.items():
        assert answer.headers[name.encode()] == value.encode()


async def test_a_megabyte_request_line_is_answered_414_and_read_whole(served: Served) -> None:
    """The client writes all 1 MB while reading: it reads the whole 414 (no reset), the
    server drops the rest, and closes as soon as the client has finished."""
    async with connected(served) as (reader, writer):
        answer = await send_and_read(reader, writer, LONG_LINE, then_eof=True)
        assert_answer(answer, b"HTTP/1.1 414 URI Too Long", b"request line too long\n")
        await served.closed_within(1.0)


async def test_200_kb_of_headers_are_answered_431_and_read_whole(served: Served) -> None:
    """The request line is complete, the headers are not: 431, read whole."""
    assert len(LONG_HEADERS) > 200_000
    async with connected(served) as (reader, writer):
        answer = await send_and_read(reader, writer, LONG_HEADERS, then_eof=True)
        status = b"HTTP/1.1 431 Request Header Fields Too Large"
        assert_answer(answer, status, b"request headers too large\n")
        await served.closed_within(1.0)


async def test_a_second_request_on_a_kept_alive_connection_is_judged_alone(
    served: Served,
) -> None:
    """After a good request, an over-long line on the same connection is 414."""
    async with connected(served) as (reader, writer), asyncio.timeout(10):
        writer.write(b"GET / HTTP/1.1\r\nhost: console\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert await reader.readexactly(3) == b"ok\n"
        answer = await send_and_read(reader, writer, LONG_LINE, then_eof=True)
    assert_answer(answer, b"HTTP/1.1 414 URI Too Long", b"request line too long\n")


async def test_under_the_limit_is_the_apps_and_other_errors_stay_400(served: Served) -> None:
    """A head just under HEADER_LIMIT reaches the app; a malformed request and an
    over-long chunk line in a body (the same h11 error, past the head) are uvicorn's 400."""
    head = b"GET / HTTP/1.1\r\nhost: console\r\nconnection: close\r\nx-h: %s\r\n\r\n"
    near = head % (b"c" * (protocol.HEADER_LIMIT - 16 - len(head) + 2))
    assert len(near) == protocol.HEADER_LIMIT - 16
    answer = await answer_to(served, near)
    assert (answer.status_line, answer.body) == (b"HTTP/1.1 200 OK", b"ok\n")

    answer = await answer_to(served, b"GARBAGE\r\n\r\n")
    assert answer.status_line == b"HTTP/1.1 400 Bad Request"
    assert b"content-security-policy" not in answer.headers  # uvicorn's own answer

    chunked = b"POST / HTTP/1.1\r\nhost: console\r\ntransfer-encoding: chunked\r\n\r\n"
    answer = await answer_to(served, chunked + b"1" * 20_000, then_eof=False)
    assert answer.status_line == b"HTTP/1.1 400 Bad Request"


async def test_a_client_that_stops_sending_but_stays_is_closed_in_time(served: Served) -> None:
    """An over-long line, then silence with the connection open: the client reads the
    414 and the end of the stream at once, the server closes after DRAIN_SECONDS."""
    async with connected(served) as (reader, writer):
        over = b"GET /" + b"a" * (2 * protocol.HEADER_LIMIT)
        answer = await send_and_read(reader, writer, over, then_eof=False)
        answered = time.monotonic()
        assert_answer(answer, b"HTTP/1.1 414 URI Too Long", b"request line too long\n")
        await served.closed_within(protocol.DRAIN_SECONDS + 2)
        assert time.monotonic() - answered > protocol.DRAIN_SECONDS - 0.5


async def keep_sending(writer: asyncio.StreamWriter, piece: bytes, pace: float) -> None:
    """Sends ``piece`` every ``pace`` seconds until the server resets the connection."""
    with contextlib.suppress(ConnectionError):
        while True:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(pace)


@pytest.mark.parametrize(
    ("piece", "pace"), [(b"d" * 100, 0.05), (b"f" * CHUNK, 0.0)], ids=["drip", "flood"]
)
async def test_a_client_that_keeps_sending_does_not_keep_the_connection(
    served: Served, piece: bytes, pace: float
) -> None:
    """After the answer, a client sending a little all the time is closed after
    DRAIN_SECONDS, and one sending as fast as it can sooner, after DRAIN_BYTES."""
    async with connected(served) as (reader, writer):
        writer.write(b"GET /" + b"a" * (2 * protocol.HEADER_LIMIT))
        sending = asyncio.create_task(keep_sending(writer, piece, pace))
        try:
            async with asyncio.timeout(5):
                answer = Answer.parse(await read_to_end(reader))
            answered = time.monotonic()
            assert_answer(answer, b"HTTP/1.1 414 URI Too Long", b"request line too long\n")
            await served.closed_within(protocol.DRAIN_SECONDS + 2)
            took = time.monotonic() - answered
        finally:
            async with asyncio.timeout(5):
                await sending  # ends with the server's reset
    if pace:
        assert took > protocol.DRAIN_SECONDS - 0.5
    else:
        assert took < protocol.DRAIN_SECONDS - 0.5  # the byte bound came first


def test_the_installed_uvicorn_gets_the_console_protocol(monkeypatch: pytest.MonkeyPatch) -> None:
    """uvicorn 0.54 / h11 0.16 get ConsoleH11Protocol; a uvicorn outside the checked
    range gets uvicorn's own "h11"."""
    assert protocol.http_protocol() is protocol.ConsoleH11Protocol
    monkeypatch.setattr(protocol, "UVICORN_RANGE", ((0, 10), (0, 20)))
    assert protocol.http_protocol() == "h11"
