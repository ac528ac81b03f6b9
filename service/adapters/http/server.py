"""A small HTTP endpoint for container platforms and Prometheus.

``GET /healthz``  200 while the process's event loop answers (liveness)
``GET /readyz``   200 only while the consumer has an open channel with its
                  consumer attached and a working database pool, else 503
``GET /metrics``  Prometheus text format (when metrics are enabled)

``HEAD`` is answered like ``GET`` without the body. Requests are parsed with
h11, one per connection (every answer carries ``Connection: close``), and the
endpoint answers anything a client sends without a traceback:

* at most ``MAX_CONNECTIONS`` connections are handled at once; more are
  answered 503 at once and closed;
* the request head must arrive within ``REQUEST_TIMEOUT_SECONDS`` (else 408)
  and fit in ``MAX_REQUEST_HEAD_BYTES`` with at most ``MAX_HEADERS`` fields
  (else 414 or 431); a malformed request gets 400, an HTTP version other than
  1.x 505, a body 413, another method 405, another path 404;
* one readiness check runs at a time, and every ``/readyz`` request that
  arrives meanwhile gets its result; at most ``READINESS_MAX_CHECKS`` checks
  start per ``READINESS_WINDOW_SECONDS`` (further requests get the latest
  result), so a flood of probes holds at most one database connection and
  costs a few round-trips a second. A check that fails or takes longer than
  ``CHECK_TIMEOUT_SECONDS`` means "not ready".
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus

import h11

log = logging.getLogger(__name__)

ReadinessCheck = Callable[[], Awaitable[dict[str, bool]]]

# A client has this long to send its request head, and again to take the answer.
REQUEST_TIMEOUT_SECONDS = 5.0
# Connections handled at once; more are answered 503 at once.
MAX_CONNECTIONS = 64
# The request line and header fields together (h11's incomplete event limit).
MAX_REQUEST_HEAD_BYTES = 8192
MAX_HEADERS = 100
READ_CHUNK_BYTES = 1024
# After refusing a request that was not read to its end, read and drop what the
# client still sends (this long, this much at most) before closing, so that
# closing does not reset the connection before the client reads the answer.
LINGER_SECONDS = 1.0
LINGER_BYTES = 256 * 1024
# Readiness: one shared check at a time, this many starts per window at most.
CHECK_TIMEOUT_SECONDS = 3.0
READINESS_MAX_CHECKS = 5
READINESS_WINDOW_SECONDS = 1.0
# Connections over the limit are answered 503 and closed this long after (see _turn_away),
# at most this many at a time (beyond, they are closed at once).
TURN_AWAY_GRACE_SECONDS = 0.5
MAX_TURNED_AWAY_OPEN = 256
# At most one "health.busy" warning per this many seconds.
BUSY_LOG_INTERVAL_SECONDS = 10.0

ALLOWED_METHODS = ("GET", "HEAD")


def _response(
    status: int,
    body: bytes,
    content_type: str = "text/plain",
    *,
    head_only: bool = False,
    headers: tuple[tuple[str, str], ...] = (),
) -> bytes:
    """A complete HTTP/1.1 response that closes the connection."""
    lines = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        *(f"{name}: {value}" for name, value in headers),
        "Connection: close",
    ]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + body


def prometheus_text() -> tuple[bytes, str]:
    """The default Prometheus registry (where the OpenTelemetry reader registers)."""
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


@dataclass(frozen=True)
class _Refusal:
    """A request answered with an error status before routing."""

    status: int
    reason: str


def _clean_reason(exc: h11.RemoteProtocolError) -> str:
    """h11's description without the request bytes it may quote."""
    text = str(exc).split(":", 1)[0]
    text = "".join(char for char in text if char.isprintable())[:60].strip()
    return text or "malformed request"


def _has_body(request: h11.Request) -> bool:
    return any(
        name == b"transfer-encoding" or (name == b"content-length" and value.strip(b"0") != b"")
        for name, value in request.headers
    )


def _vet(request: h11.Request) -> _Refusal | None:
    """Why a well-formed request head is refused, if it is."""
    if not request.http_version.startswith(b"1."):
        return _Refusal(505, "unsupported HTTP version")
    if len(request.headers) > MAX_HEADERS:
        return _Refusal(431, "too many header fields")
    if request.method.decode("latin-1") in ALLOWED_METHODS and _has_body(request):
        return _Refusal(413, "request body not accepted")
    return None


async def _read_request(reader: asyncio.StreamReader) -> h11.Request | _Refusal | None:
    """The request head, why it is refused, or None if the client sent nothing."""
    parser = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_HEAD_BYTES)
    line_ended = False
    while True:
        try:
            event = parser.next_event()
        except h11.RemoteProtocolError as exc:
            if exc.error_status_hint == 431:  # the incomplete head grew over the limit
                if not line_ended:
                    return _Refusal(414, "request line too long")
                return _Refusal(431, "request head too large")
            return _Refusal(exc.error_status_hint, _clean_reason(exc))
        if isinstance(event, h11.Request):
            return _vet(event) or event
        if event is not h11.NEED_DATA:
            return None  # the client closed before sending anything
        data = await reader.read(READ_CHUNK_BYTES)
        line_ended = line_ended or b"\n" in data
        parser.receive_data(data)


class _SharedCheck:
    """The readiness check, run once for all the requests that wait for it."""

    def __init__(self, check: ReadinessCheck) -> None:
        self._check = check
        self._running: asyncio.Task[dict[str, bool] | None] | None = None
        self._latest: dict[str, bool] | None = None
        self._have_latest = False
        self._started: collections.deque[float] = collections.deque()

    async def result(self) -> dict[str, bool] | None:
        """The checks (None if the check failed): the running one's, a new one's or the latest."""
        if self._running is None:
            now = asyncio.get_running_loop().time()
            while self._started and now - self._started[0] >= READINESS_WINDOW_SECONDS:
                self._started.popleft()
            if self._have_latest and len(self._started) >= READINESS_MAX_CHECKS:
                return self._latest
            self._started.append(now)
            self._running = asyncio.create_task(self._run())
        # A waiter that is cancelled (its client timed out) leaves the check to the others.
        return await asyncio.shield(self._running)

    async def _run(self) -> dict[str, bool] | None:
        checks: dict[str, bool] | None
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_SECONDS):
                checks = dict(await self._check())
        except Exception as exc:  # a check that fails means "not ready", which is the answer
            log.warning("health.readiness_failed", extra={"error_class": type(exc).__name__})
            checks = None
        finally:
            self._running = None  # even if cancelled: the next request starts a new check
        self._latest, self._have_latest = checks, True
        return checks

    async def close(self) -> None:
        """Cancel a check that is still running."""
        running = self._running
        if running is not None:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)


class HealthServer:
    """Serves liveness, readiness and metrics on one port."""

    def __init__(
        self,
        readiness: ReadinessCheck,
        *,
        metrics: bool,
        liveness: Callable[[], bool] | None = None,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.readiness = readiness
        self.liveness = liveness  # None: alive while the event loop answers
        self.metrics = metrics
        self.max_connections = max_connections
        self.server: asyncio.Server | None = None
        self._check = _SharedCheck(lambda: self.readiness())
        self._handlers: set[asyncio.Task[None]] = set()
        self._turned_away = 0
        self._turned_away_open: set[asyncio.StreamWriter] = set()
        self._busy_logged_at = -math.inf

    @property
    def active_connections(self) -> int:
        """Connections being handled now."""
        return len(self._handlers)

    async def start(self, host: str, port: int) -> int:
        """Listen; return the bound port (useful with port 0)."""
        self.server = await asyncio.start_server(
            self._on_client, host, port, limit=MAX_REQUEST_HEAD_BYTES
        )
        bound: int = self.server.sockets[0].getsockname()[1]
        log.info("health.listening", extra={"host": host, "port": bound})
        return bound

    async def close(self) -> None:
        """Stop listening, drop the connections being handled and any running check."""
        if self.server is not None:
            self.server.close()
        for handler in self._handlers:
            handler.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        for writer in list(self._turned_away_open):
            self._close_turned_away(writer)
        await self._check.close()
        if self.server is not None:
            await self.server.wait_closed()

    async def route(self, method: str, path: str) -> bytes:
        """The full HTTP response for one request."""
        if method not in ALLOWED_METHODS:
            allow = ", ".join(ALLOWED_METHODS)
            return _response(405, b"GET or HEAD only\n", headers=(("Allow", allow),))
        head_only = method == "HEAD"
        path = path.split("?", 1)[0]
        if path == "/healthz":
            if self.liveness is None or self.liveness():
                return _response(200, b"ok\n", head_only=head_only)
            return _response(503, b"unhealthy\n", head_only=head_only)
        if path == "/readyz":
            checks = await self._check.result()
            ready = checks is not None and all(checks.values())
            body = json.dumps({"ready": ready, **(checks or {})}).encode() + b"\n"
            return _response(200 if ready else 503, body, "application/json", head_only=head_only)
        if path == "/metrics" and self.metrics:
            text, content_type = prometheus_text()
            return _response(200, text, content_type, head_only=head_only)
        return _response(404, b"not found\n", head_only=head_only)

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        if handler is None or len(self._handlers) >= self.max_connections:
            self._turn_away(writer)
            return
        self._handlers.add(handler)
        clean = False
        try:
            await self._serve(reader, writer)
            clean = True
        except (OSError, TimeoutError):
            pass  # the client went away or does not take the answer: nothing to tell it
        except asyncio.CancelledError:
            # close() cancels handlers. Nothing awaits this task, and ending it normally
            # keeps Python 3.11's start_server callback from reporting the cancellation.
            pass
        finally:
            self._handlers.discard(handler)
            if clean:
                writer.close()
            else:
                writer.transport.abort()

    def _turn_away(self, writer: asyncio.StreamWriter) -> None:
        """Answer 503 without reading the request, and close."""
        self._turned_away += 1
        now = asyncio.get_running_loop().time()
        if now - self._busy_logged_at >= BUSY_LOG_INTERVAL_SECONDS:
            log.warning(
                "health.busy",
                extra={"limit": self.max_connections, "turned_away": self._turned_away},
            )
            self._busy_logged_at, self._turned_away = now, 0
        writer.write(_response(503, b"busy\n", headers=(("Retry-After", "1"),)))
        if len(self._turned_away_open) >= MAX_TURNED_AWAY_OPEN:
            writer.close()  # a client that already sent its request may see a reset
            return
        # Closing with the request unread would reset the connection, and the client might
        # lose the 503: end the answer now and close a moment later, with no task waiting.
        writer.write_eof()
        self._turned_away_open.add(writer)
        asyncio.get_running_loop().call_later(
            TURN_AWAY_GRACE_SECONDS, self._close_turned_away, writer
        )

    def _close_turned_away(self, writer: asyncio.StreamWriter) -> None:
        if writer in self._turned_away_open:
            self._turned_away_open.discard(writer)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_SECONDS):
                request = await _read_request(reader)
        except TimeoutError:
            await _send(writer, _response(408, b"request timeout\n"), linger=reader)
            return
        if request is None:
            return
        if isinstance(request, _Refusal):
            log.info(
                "health.bad_request", extra={"status": request.status, "reason": request.reason}
            )
            body = request.reason.encode() + b"\n"
            await _send(writer, _response(request.status, body), linger=reader)
            return
        method, target = request.method.decode("latin-1"), request.target.decode("latin-1")
        try:
            response = await self.route(method, target)
        except Exception:  # a bug here must not go unanswered; it is logged in full
            log.exception("health.internal_error")
            response = _response(500, b"internal error\n")
        await _send(writer, response, linger=reader if _has_body(request) else None)


async def _send(
    writer: asyncio.StreamWriter, response: bytes, *, linger: asyncio.StreamReader | None = None
) -> None:
    """Write the answer; with ``linger``, drop what the client still sends until it closes."""
    writer.write(response)
    async with asyncio.timeout(REQUEST_TIMEOUT_SECONDS):
        await writer.drain()
    if linger is None:
        return
    if writer.can_write_eof():
        writer.write_eof()
    left = LINGER_BYTES
    try:
        async with asyncio.timeout(LINGER_SECONDS):
            while left > 0 and (data := await linger.read(min(left, 65536))):
                left -= len(data)
    except TimeoutError:
        pass


@contextlib.asynccontextmanager
async def serving(
    host: str,
    port: int,
    readiness: ReadinessCheck,
    *,
    metrics: bool = True,
    liveness: Callable[[], bool] | None = None,
) -> AsyncIterator[HealthServer | None]:
    """A process's ``/healthz``, ``/readyz`` (and ``/metrics``) on ``host:port`` for the
    block; none when ``port`` is 0 (``EXPIRY_HTTP_PORT`` unset)."""
    if not port:
        yield None
        return
    server = HealthServer(readiness, metrics=metrics, liveness=liveness)
    await server.start(host, port)
    try:
        yield server
    finally:
        await server.close()
