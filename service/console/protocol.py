"""The console's HTTP/1.1 protocol: uvicorn's h11 one, answering an over-long request
line with 414 and over-long headers with 431, then closing so the client reads it.

Stock uvicorn answers h11's "receive buffer too long" error (more than
``h11_max_incomplete_event_size`` bytes of an unfinished request head) with a 400 and
closes at once, while the client is still sending: the unread data makes the kernel
reset the connection, and the client sees a reset, not the answer.

This touches uvicorn internals: it subclasses
``uvicorn.protocols.http.h11_impl.H11Protocol`` and overrides ``send_400_response``
(which ``handle_events`` calls inside its ``except h11.RemoteProtocolError`` block, so
the error is ``sys.exception()`` there) and ``data_received`` (to discard what the
client still sends). Checked on uvicorn 0.54.0 with h11 0.16.0; ``http_protocol()``
falls back to uvicorn's own ``"h11"`` where those methods are not as expected.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections.abc import Callable
from importlib import metadata

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from service.console.guard import SECURITY_HEADERS

CHECKED_ON = {"uvicorn": "0.54.0", "h11": "0.16.0"}
# uvicorn releases whose H11Protocol this class is used with, once inspect agrees.
UVICORN_RANGE = ((0, 30), (1, 0))
H11_RANGE = ((0, 14), (1, 0))

# The most bytes of an unfinished request head (request line + headers) buffered:
# uvicorn's h11_max_incomplete_event_size, whose default this is.
HEADER_LIMIT = 16 * 1024
# After the answer: what the client still sends is read and dropped for at most this
# long and this much, then the connection is closed whatever the client does.
DRAIN_SECONDS = 2.0
DRAIN_BYTES = 4 * 1024 * 1024

_ANSWERS = {
    414: (b"URI Too Long", b"request line too long\n"),
    431: (b"Request Header Fields Too Large", b"request headers too large\n"),
}


def _too_long_status(conn: h11.Connection) -> int | None:
    """414 or 431 when the error being handled is h11's over-long request head, else None."""
    error = sys.exception()
    if not isinstance(error, h11.RemoteProtocolError) or error.error_status_hint != 431:
        return None
    # h11 raises the same error for an over-long chunk line of a body; the server is
    # still IDLE only while the request head is unfinished.
    if conn.our_state is not h11.IDLE:
        return None
    received, _ = conn.trailing_data
    return 431 if b"\n" in received else 414  # h11 ends a line at LF, with or without CR


class ConsoleH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, with 414/431 for an over-long request head and a close
    the client can read."""

    # Bytes dropped since the answer; None until then.
    _discarded: int | None = None

    def send_400_response(self, msg: str) -> None:
        """Answer 414 or 431 for an over-long request head; any other error as uvicorn does."""
        status = _too_long_status(self.conn)
        if status is None:
            super().send_400_response(msg)
            return
        reason, body = _ANSWERS[status]
        headers = [
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
            *((name.encode(), value.encode()) for name, value in SECURITY_HEADERS.items()),
        ]
        response = h11.Response(status_code=status, headers=headers, reason=reason)
        events = (response, h11.Data(data=body), h11.EndOfMessage())
        self.transport.write(b"".join(self.conn.send(event) or b"" for event in events))
        self._drain()

    def _drain(self) -> None:
        """Half-close, then read and drop for a bounded time and amount before closing."""
        self._discarded = 0
        self._unset_keepalive_if_required()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.flow.resume_reading()
        self.loop.call_later(DRAIN_SECONDS, self.transport.close)

    def data_received(self, data: bytes) -> None:
        """Drop what arrives after a 414/431 answer (closing past DRAIN_BYTES)."""
        if self._discarded is None:
            super().data_received(data)
            return
        self._discarded += len(data)
        if self._discarded >= DRAIN_BYTES:
            self.transport.close()


def _version(text: str) -> tuple[int, int] | None:
    try:
        major, minor = text.split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


def _within(package: str, span: tuple[tuple[int, int], tuple[int, int]]) -> bool:
    try:
        version = _version(metadata.version(package))
    except metadata.PackageNotFoundError:
        return False
    return version is not None and span[0] <= version < span[1]


def _parameters(function: Callable[..., object]) -> list[str]:
    try:
        return list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return []


def _fits_installed_uvicorn() -> bool:
    """Whether the installed uvicorn and h11 have what ConsoleH11Protocol overrides."""
    if not (_within("uvicorn", UVICORN_RANGE) and _within("h11", H11_RANGE)):
        return False
    if _parameters(H11Protocol.send_400_response) != ["self", "msg"]:
        return False
    if _parameters(H11Protocol.data_received) != ["self", "data"]:
        return False
    if not callable(getattr(H11Protocol, "_unset_keepalive_if_required", None)):
        return False
    try:
        source = inspect.getsource(H11Protocol.handle_events)
    except (OSError, TypeError):
        return False
    handler = source.find("except h11.RemoteProtocolError")
    return handler != -1 and source.find("self.send_400_response(", handler) != -1


def http_protocol() -> type[asyncio.Protocol] | str:
    """ConsoleH11Protocol on a uvicorn it was checked against, else uvicorn's ``"h11"``."""
    return ConsoleH11Protocol if _fits_installed_uvicorn() else "h11"
