"""A webhook receiver that answers and keeps nothing but counts: what the benchmark's
deliverers POST to, so that a delivery costs what it costs the deliverer, not a web
framework's work in the same process or on its core.

``python -m bench.receiver --port-file F --out J`` listens on 127.0.0.1 (a free port,
written to F), answers every request ``200`` with an empty body on a kept-alive
connection (HTTP/1.1, read with ``Content-Length`` only: what the deliverer sends), and
at SIGTERM writes to J ``{"requests": n, "distinct": n, "invalid": n,
"first": t, "last": t}``: the requests, their distinct ``webhook-id`` headers (a
delivery made twice counts once), the requests it could not read (answered ``400``, the
connection closed), and the arrival of the first and the last request
(``time.monotonic()`` of this process: only their difference means anything). It
neither verifies the signatures (the integration tests do) nor parses the bodies.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
BAD = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
HEAD_END = b"\r\n\r\n"
MAX_HEAD = 64 * 1024
MAX_BODY = 16 * 1024 * 1024


@dataclass
class Tally:
    """What the receiver was sent."""

    requests: int = 0
    invalid: int = 0
    ids: set[bytes] = field(default_factory=set)
    first: float = 0.0
    last: float = 0.0

    def add(self, message_id: bytes) -> None:
        now = time.monotonic()
        if not self.requests:
            self.first = now
        self.requests += 1
        self.last = now
        self.ids.add(message_id)

    def summary(self) -> dict[str, float]:
        return {
            "requests": self.requests,
            "distinct": len(self.ids),
            "invalid": self.invalid,
            "first": self.first,
            "last": self.last,
        }


def head_of(head: bytes) -> tuple[int, bytes] | None:
    """``(Content-Length, webhook-id)`` of a request's head; None if it cannot be read
    (no length, a chunked body, a length out of bounds)."""
    length, message_id = -1, b""
    for line in head.split(b"\r\n")[1:]:
        name, colon, value = line.partition(b":")
        if not colon:
            return None
        name = name.strip().lower()
        if name == b"content-length":
            try:
                length = int(value.strip())
            except ValueError:
                return None
        elif name == b"webhook-id":
            message_id = value.strip()
        elif name == b"transfer-encoding":
            return None
    return (length, message_id) if 0 <= length <= MAX_BODY else None


class Receiving(asyncio.Protocol):
    """One connection: requests one after the other (the deliverer does not pipeline)."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.body_left = -1  # -1: reading a head
        self.message_id = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.buffer += data
        while True:
            if self.body_left < 0:
                end = self.buffer.find(HEAD_END)
                if end < 0:
                    if len(self.buffer) > MAX_HEAD:
                        self._refuse()
                    return
                read = head_of(bytes(self.buffer[:end]))
                del self.buffer[: end + len(HEAD_END)]
                if read is None:
                    self._refuse()
                    return
                self.body_left, self.message_id = read
            if len(self.buffer) < self.body_left:
                return
            del self.buffer[: self.body_left]
            self.body_left = -1
            self.tally.add(self.message_id)
            self.transport.write(OK)

    def _refuse(self) -> None:
        assert self.transport is not None
        self.tally.invalid += 1
        self.transport.write(BAD)
        self.transport.close()
        self.buffer.clear()


async def serve(tally: Tally, listening: Callable[[int], None]) -> None:
    """Listen (telling ``listening`` the port) until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    server = await loop.create_server(lambda: Receiving(tally), "127.0.0.1", 0, backlog=1024)
    listening(server.sockets[0].getsockname()[1])
    await stop.wait()
    server.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.receiver", description=__doc__)
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    with contextlib.suppress(ImportError):
        import uvloop  # the service's own loop, where installed

        factory = uvloop.new_event_loop
    tally = Tally()

    def listening(port: int) -> None:
        args.port_file.write_text(str(port))

    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(serve(tally, listening))
    args.out.write_text(json.dumps(tally.summary()))


if __name__ == "__main__":
    main()
