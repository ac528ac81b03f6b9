"""A small HTTP endpoint for container platforms and Prometheus.

``GET /healthz``  200 while the process's event loop answers (liveness)
``GET /readyz``   200 only while the consumer has an open channel with its
                  consumer attached and a working database pool, else 503
``GET /metrics``  Prometheus text format (when metrics are enabled)
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

ReadinessCheck = Callable[[], Awaitable[dict[str, bool]]]
REQUEST_TIMEOUT_SECONDS = 5.0


def _response(status: int, body: bytes, content_type: str) -> bytes:
    reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}
    head = (
        f"HTTP/1.1 {status} {reason.get(status, 'Error')}\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


def prometheus_text() -> tuple[bytes, str]:
    """The default Prometheus registry (where the OpenTelemetry reader registers)."""
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


class HealthServer:
    """Serves liveness, readiness and metrics on one port."""

    def __init__(self, readiness: ReadinessCheck, *, metrics: bool) -> None:
        self.readiness = readiness
        self.metrics = metrics
        self.server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; return the bound port (useful with port 0)."""
        self.server = await asyncio.start_server(self._on_client, host, port)
        bound: int = self.server.sockets[0].getsockname()[1]
        log.info("health.listening", extra={"host": host, "port": bound})
        return bound

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def route(self, method: str, path: str) -> bytes:
        """The full HTTP response for one request."""
        if method != "GET":
            return _response(405, b"GET only\n", "text/plain")
        path = path.split("?", 1)[0]
        if path == "/healthz":
            return _response(200, b"ok\n", "text/plain")
        if path == "/readyz":
            checks = await self.readiness()
            ready = all(checks.values())
            body = json.dumps({"ready": ready, **checks}).encode() + b"\n"
            return _response(200 if ready else 503, body, "application/json")
        if path == "/metrics" and self.metrics:
            text, content_type = prometheus_text()
            return _response(200, text, content_type)
        return _response(404, b"not found\n", "text/plain")

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_SECONDS):
                request = await reader.readline()
                while (await reader.readline()).strip():
                    pass  # headers are not needed
                parts = request.decode("latin-1").split()
                method, path = (parts[0], parts[1]) if len(parts) >= 2 else ("", "")
                writer.write(await self.route(method, path))
                await writer.drain()
        except (TimeoutError, OSError, UnicodeError):
            pass
        finally:
            writer.close()
