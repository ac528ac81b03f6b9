"""Unit tests for the HTTP endpoint: it answers any request safely (localhost only)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from service.adapters.http import server as http_server
from service.adapters.http.server import (
    MAX_CONNECTIONS,
    READINESS_MAX_CHECKS,
    HealthServer,
    ReadinessCheck,
)
from service.healthcheck import Target, ready

HOST = "127.0.0.1"


async def _all_ready() -> dict[str, bool]:
    return {"channel": True, "database": True}


@contextlib.asynccontextmanager
async def serving(
    readiness: ReadinessCheck = _all_ready,
    *,
    metrics: bool = False,
    max_connections: int = MAX_CONNECTIONS,
) -> AsyncIterator[tuple[HealthServer, int]]:
    """A started server on a free localhost port, closed afterwards."""
    server = HealthServer(readiness, metrics=metrics, max_connections=max_connections)
    port = await server.start(HOST, 0)
    try:
        yield server, port
    finally:
        await server.close()


@dataclass(frozen=True)
class Answer:
    """One parsed HTTP response."""

    status: int
    headers: dict[str, str]
    body: bytes


def parse(raw: bytes) -> Answer:
    """Split a raw response into status, headers (lower-case names) and body."""
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Answer(int(status_line.split(" ")[1]), headers, body)


async def exchange(port: int, data: bytes, *, timeout: float = 5.0) -> Answer:
    """Send ``data`` and read until the server closes the connection."""
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection(HOST, port)
        try:
            writer.write(data)
            await writer.drain()
            return parse(await reader.read())
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


def get(path: str, method: str = "GET") -> bytes:
    """A minimal valid HTTP/1.1 request."""
    return f"{method} {path} HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode()


@pytest.fixture
async def loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """What reaches the event loop's exception handler during the test."""
    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    yield seen
    loop.set_exception_handler(previous)


def assert_quiet(caplog: pytest.LogCaptureFixture, loop_errors: list[dict[str, Any]]) -> None:
    """No ERROR, no traceback, nothing unhandled: neither in the logs nor in the loop."""
    gc.collect()  # "Task exception was never retrieved" is reported on collection
    assert loop_errors == []
    for record in caplog.records:
        assert record.levelno < logging.ERROR, record.getMessage()
        assert record.exc_info is None, record.getMessage()
        assert "Unhandled exception" not in record.getMessage()


@pytest.fixture(autouse=True)
def _capture_logs(caplog: pytest.LogCaptureFixture) -> None:
    """Every record, from the root logger and asyncio's, is captured."""
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="asyncio")


def bad_requests(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The health.bad_request records."""
    return [r for r in caplog.records if r.getMessage() == "health.bad_request"]


async def test_valid_requests_keep_their_answers(
    caplog: pytest.LogCaptureFixture, loop_errors: list[dict[str, Any]]
) -> None:
    """A real HTTP client gets liveness, readiness JSON, 404s and Connection: close as before."""
    async with (
        serving() as (_server, port),
        httpx.AsyncClient(base_url=f"http://{HOST}:{port}") as client,
    ):
        live = await client.get("/healthz")
        assert (live.status_code, live.text) == (200, "ok\n")
        assert live.headers["connection"] == "close"
        readyz = await client.get("/readyz?verbose=1")
        assert readyz.status_code == 200
        assert readyz.headers["content-type"] == "application/json"
        assert readyz.json() == {"ready": True, "channel": True, "database": True}
        assert (await client.get("/metrics")).status_code == 404  # metrics disabled
        assert (await client.get("/nope")).status_code == 404
    assert bad_requests(caplog) == []
    assert_quiet(caplog, loop_errors)


async def test_head_is_answered_without_a_body() -> None:
    """HEAD gets GET's status and headers (Content-Length included) but no body."""
    async with serving() as (_server, port):
        answer = await exchange(port, get("/healthz", "HEAD"))
    assert (answer.status, answer.headers["content-length"], answer.body) == (200, "3", b"")


async def test_a_liveness_check_decides_healthz() -> None:
    """With a liveness check (the scanner's: its passes succeed), /healthz follows it."""
    alive = [True]
    server = HealthServer(_all_ready, metrics=False, liveness=lambda: alive[0])
    port = await server.start(HOST, 0)
    try:
        assert (await exchange(port, get("/healthz"))).status == 200
        alive[0] = False
        answer = await exchange(port, get("/healthz"))
    finally:
        await server.close()
    assert (answer.status, answer.body) == (503, b"unhealthy\n")


async def test_metrics_are_served_in_prometheus_text() -> None:
    """With metrics enabled, /metrics answers the default registry in Prometheus text."""
    async with serving(metrics=True) as (_server, port):
        answer = await exchange(port, get("/metrics"))
    assert answer.status == 200
    assert answer.headers["content-type"].startswith("text/plain")
    assert b"# TYPE " in answer.body


async def test_healthcheck_command_accepts_the_endpoint() -> None:
    """The container HEALTHCHECK's HTTP/1.0 request without Host is answered 200."""
    async with serving() as (_server, port):
        assert await ready(Target("the readiness endpoint", HOST, port), 5.0) is None


async def test_huge_request_line_is_refused_without_a_traceback(
    caplog: pytest.LogCaptureFixture, loop_errors: list[dict[str, Any]]
) -> None:
    """A 100 KiB request line gets 414 and Connection: close, logged as one INFO line."""
    request = b"GET /" + b"a" * 100 * 1024 + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    async with serving() as (_server, port):
        answer = await exchange(port, request)
        assert (await exchange(port, get("/healthz"))).status == 200
    assert answer.status == 414
    assert answer.headers["connection"] == "close"
    [record] = bad_requests(caplog)
    assert (record.levelno, record.__dict__["status"]) == (logging.INFO, 414)
    assert record.__dict__["reason"] == "request line too long"
    assert_quiet(caplog, loop_errors)


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(b"\x00\x01\xfe\xff garbage\r\n\r\n", id="binary"),
        pytest.param(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", id="tls-hello"),
        pytest.param(b"GET /a b HTTP/1.1\r\nHost: x\r\n\r\n", id="space-in-target"),
        pytest.param(b"GET /healthz HTTX/1.1\r\nHost: x\r\n\r\n", id="bad-version-syntax"),
        pytest.param(b"GET /healthz HTTP/1.1\r\n\r\n", id="no-host"),
        pytest.param(b"GET /healthz HTTP/1.1\r\nno colon\r\n\r\n", id="bad-header-line"),
        pytest.param(b"GET /healthz HTTP/1.1\r\nHost: x\r\n", id="cut-short"),
    ],
)
async def test_malformed_requests_get_400(
    request_bytes: bytes, caplog: pytest.LogCaptureFixture, loop_errors: list[dict[str, Any]]
) -> None:
    """Garbage, malformed or truncated requests get 400 and one INFO line without their bytes."""
    async with serving() as (_server, port):
        async with asyncio.timeout(5):
            reader, writer = await asyncio.open_connection(HOST, port)
            writer.write(request_bytes)
            writer.write_eof()  # the cut-short request ends here
            answer = parse(await reader.read())
            writer.close()
            await writer.wait_closed()
    assert answer.status == 400
    assert answer.headers["connection"] == "close"
    [record] = bad_requests(caplog)
    assert record.levelno == logging.INFO
    assert all(char.isprintable() for char in record.__dict__["reason"])
    assert "garbage" not in record.__dict__["reason"]
    assert_quiet(caplog, loop_errors)


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(
            b"POST /readyz HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello", id="post"
        ),
        pytest.param(get("/healthz", "DELETE"), id="delete"),
        pytest.param(b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", id="options"),
    ],
)
async def test_other_methods_get_405_with_allow(request_bytes: bytes) -> None:
    """A method other than GET or HEAD gets 405 naming the allowed ones."""
    async with serving() as (_server, port):
        answer = await exchange(port, request_bytes)
    assert answer.status == 405
    assert answer.headers["allow"] == "GET, HEAD"


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param(b"".join(b"X-%d: y\r\n" % n for n in range(150)), id="150-fields"),
        pytest.param(b"X-Big: " + b"b" * 20 * 1024 + b"\r\n", id="20-KiB-field"),
        pytest.param(
            b"".join(b"X-%d: %s\r\n" % (n, b"c" * 500) for n in range(40)), id="20-KiB-head"
        ),
    ],
)
async def test_oversized_headers_get_431(
    headers: bytes, caplog: pytest.LogCaptureFixture, loop_errors: list[dict[str, Any]]
) -> None:
    """Too many header fields, or a head over the size limit, get 431."""
    async with serving() as (_server, port):
        answer = await exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
    assert answer.status == 431
    assert answer.headers["connection"] == "close"
    assert len(bad_requests(caplog)) == 1
    assert_quiet(caplog, loop_errors)


async def test_unsupported_http_version_gets_505() -> None:
    """A well-formed request line naming HTTP/2.0 gets 505."""
    async with serving() as (_server, port):
        answer = await exchange(port, b"GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n")
    assert answer.status == 505


@pytest.mark.parametrize(
    "framing",
    [
        b"Content-Length: 5\r\n\r\nhello",
        b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    ],
    ids=["content-length", "chunked"],
)
async def test_request_with_a_body_gets_413(framing: bytes) -> None:
    """A GET that carries a body gets 413 (the endpoint reads no bodies)."""
    async with serving() as (_server, port):
        answer = await exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + framing)
    assert answer.status == 413


async def test_concurrent_readiness_probes_share_one_check() -> None:
    """200 concurrent /readyz requests are all answered 200 from one readiness check."""
    calls = 0

    async def slow_ready() -> dict[str, bool]:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.2)
        return {"database": True}

    async with serving(slow_ready, max_connections=256) as (_server, port):
        answers = await asyncio.gather(
            *(exchange(port, get("/readyz"), timeout=10) for _ in range(200))
        )
    assert [a.status for a in answers] == [200] * 200
    assert {json.loads(a.body)["ready"] for a in answers} == {True}
    assert calls <= 2  # one, unless a connection was accepted after the check ended


async def test_a_probe_flood_starts_few_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Back-to-back probes start at most READINESS_MAX_CHECKS checks per window; the rest reuse."""
    monkeypatch.setattr(http_server, "READINESS_WINDOW_SECONDS", 60.0)
    calls = 0

    async def counted() -> dict[str, bool]:
        nonlocal calls
        calls += 1
        return {"database": True}

    async with serving(counted) as (_server, port):
        answers = [await exchange(port, get("/readyz")) for _ in range(20)]
    assert [a.status for a in answers] == [200] * 20
    assert calls == READINESS_MAX_CHECKS


async def test_infrequent_probes_see_a_state_change_at_once() -> None:
    """Below the check rate limit, every probe runs a fresh check."""
    state = {"database": True}

    async def current() -> dict[str, bool]:
        return dict(state)

    async with serving(current) as (_server, port):
        assert (await exchange(port, get("/readyz"))).status == 200
        state["database"] = False
        unready = await exchange(port, get("/readyz"))
        assert unready.status == 503
        assert json.loads(unready.body) == {"ready": False, "database": False}
        assert (await exchange(port, get("/healthz"))).status == 200


async def test_a_failing_readiness_check_means_not_ready(
    caplog: pytest.LogCaptureFixture, loop_errors: list[dict[str, Any]]
) -> None:
    """A readiness callable that raises gives 503 and a WARNING line, not a traceback."""

    async def broken() -> dict[str, bool]:
        raise RuntimeError("pool is gone")

    async with serving(broken) as (_server, port):
        answer = await exchange(port, get("/readyz"))
    assert answer.status == 503
    assert json.loads(answer.body) == {"ready": False}
    [record] = [r for r in caplog.records if r.getMessage() == "health.readiness_failed"]
    assert (record.levelno, record.__dict__["error_class"]) == (logging.WARNING, "RuntimeError")
    assert_quiet(caplog, loop_errors)


async def test_a_hanging_readiness_check_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """A readiness check that does not answer within CHECK_TIMEOUT_SECONDS means 503."""
    monkeypatch.setattr(http_server, "CHECK_TIMEOUT_SECONDS", 0.1)

    async def hangs() -> dict[str, bool]:
        await asyncio.sleep(60)
        return {"database": True}

    async with serving(hangs) as (_server, port):
        assert (await exchange(port, get("/readyz"), timeout=2)).status == 503


async def test_a_cancelled_waiter_leaves_the_check_to_the_others() -> None:
    """Cancelling one request waiting for the readiness check does not cancel the check."""
    started = asyncio.Event()
    release = asyncio.Event()
    calls = 0

    async def gated() -> dict[str, bool]:
        nonlocal calls
        calls += 1
        started.set()
        await release.wait()
        return {"database": True}

    server = HealthServer(gated, metrics=False)
    first = asyncio.create_task(server.route("GET", "/readyz"))
    second = asyncio.create_task(server.route("GET", "/readyz"))
    async with asyncio.timeout(5):
        await started.wait()
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        release.set()
        response = await second
    assert response.startswith(b"HTTP/1.1 200 ")
    assert calls == 1
    await server.close()


async def test_a_silent_client_is_closed_within_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client that sends nothing gets 408 and is closed once REQUEST_TIMEOUT_SECONDS pass."""
    monkeypatch.setattr(http_server, "REQUEST_TIMEOUT_SECONDS", 0.3)
    async with serving() as (server, port):
        loop = asyncio.get_running_loop()
        begun = loop.time()
        async with asyncio.timeout(2):
            reader, writer = await asyncio.open_connection(HOST, port)
            raw = await reader.read()
        answered = loop.time() - begun
        writer.close()
        await writer.wait_closed()
        async with asyncio.timeout(1):  # the server sees the close and ends the handler
            while server.active_connections:
                await asyncio.sleep(0.01)
    assert parse(raw).status == 408
    assert 0.25 <= answered < 2


async def test_a_trickling_client_is_closed_within_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client sending its head a header at a time cannot stretch the deadline."""
    monkeypatch.setattr(http_server, "REQUEST_TIMEOUT_SECONDS", 0.3)

    async def trickle(writer: asyncio.StreamWriter) -> None:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        for n in range(100):
            await asyncio.sleep(0.05)
            writer.write(b"X-%d: y\r\n" % n)

    async with serving() as (_server, port):
        async with asyncio.timeout(2):
            reader, writer = await asyncio.open_connection(HOST, port)
            sending = asyncio.create_task(trickle(writer))
            raw = await reader.read()
        sending.cancel()
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    assert parse(raw).status == 408


async def test_connections_over_the_cap_are_turned_away_at_once(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    loop_errors: list[dict[str, Any]],
) -> None:
    """Beyond the cap, connections get 503 at once; once the flood ends, /healthz answers 200."""
    monkeypatch.setattr(http_server, "REQUEST_TIMEOUT_SECONDS", 1.0)
    cap = 4
    async with serving(max_connections=cap) as (server, port):
        idle = [await asyncio.open_connection(HOST, port) for _ in range(cap)]
        async with asyncio.timeout(2):
            while server.active_connections < cap:
                await asyncio.sleep(0.01)
        async with asyncio.timeout(0.5):  # well within REQUEST_TIMEOUT_SECONDS
            excess = await asyncio.gather(*(exchange(port, b"") for _ in range(10)))
        assert {a.status for a in excess} == {503}
        assert {a.headers["retry-after"] for a in excess} == {"1"}
        async with asyncio.timeout(5):  # the idle ones time out and free their slots
            while (await exchange(port, get("/healthz"))).status != 200:
                await asyncio.sleep(0.05)
        for _reader, writer in idle:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    busy = [r for r in caplog.records if r.getMessage() == "health.busy"]
    assert [r.levelno for r in busy] == [logging.WARNING]  # one line, not one per connection
    assert_quiet(caplog, loop_errors)


async def test_close_drops_idle_connections_promptly() -> None:
    """Closing the server does not wait for idle clients to time out."""
    server = HealthServer(_all_ready, metrics=False)
    port = await server.start(HOST, 0)
    reader, writer = await asyncio.open_connection(HOST, port)
    async with asyncio.timeout(2):
        while server.active_connections < 1:
            await asyncio.sleep(0.01)
        await server.close()
        assert await reader.read() == b""
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
