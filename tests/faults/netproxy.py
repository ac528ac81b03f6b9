"""The fault suite's inspectors for ``tests/proxy.py``'s ``TcpProxy``: just enough of
the wire protocols to lose a reply at the worst moment.

``PgCommitCut`` (PostgreSQL frontend messages: it cuts the connection whose
guarded expire statement the server has just committed, so the client never
learns the outcome), ``AmqpPublishTrap`` (AMQP 0-9-1 frames: after the n-th
``basic.publish`` it holds the broker's replies, so confirms are lost, or cuts
everything) and ``AmqpAckTrap``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal
from uuid import UUID

from tests.proxy import Link, TcpProxy

# --- PostgreSQL frontend messages -------------------------------------------

_UNTYPED_FOLLOW_UPS = {80877103, 80877104}  # SSLRequest, GSSENCRequest: startup follows
EXPIRE_MARKERS = (b"UPDATE reservations", b"reservation_transitions")


class PgFrontend:
    """Splits a client's byte stream into (type, body) messages (startup: type b"")."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.startup = True

    def feed(self, data: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Add bytes; yield every complete message."""
        self.buffer += data
        while True:
            message = self._startup() if self.startup else self._typed()
            if message is None:
                return
            yield message

    def _startup(self) -> tuple[bytes, bytes] | None:
        if len(self.buffer) < 8:
            return None
        length = int.from_bytes(self.buffer[:4], "big")
        if len(self.buffer) < length:
            return None
        body = bytes(self.buffer[4:length])
        del self.buffer[:length]
        if int.from_bytes(body[:4], "big") not in _UNTYPED_FOLLOW_UPS:
            self.startup = False
        return b"", body

    def _typed(self) -> tuple[bytes, bytes] | None:
        if len(self.buffer) < 5:
            return None
        length = int.from_bytes(self.buffer[1:5], "big")
        if len(self.buffer) < 1 + length:
            return None
        kind, body = bytes(self.buffer[:1]), bytes(self.buffer[5 : 1 + length])
        del self.buffer[: 1 + length]
        return kind, body


def parse_statement(body: bytes) -> tuple[bytes, bytes]:
    """A Parse message's (statement name, query)."""
    name, _, rest = body.partition(b"\0")
    query, _, _ = rest.partition(b"\0")
    return name, query


def parse_bind(body: bytes) -> tuple[bytes, list[bytes | None]]:
    """A Bind message's (statement name, parameter values)."""
    _portal, _, rest = body.partition(b"\0")
    statement, _, rest = rest.partition(b"\0")
    (formats,) = struct.unpack_from(">h", rest, 0)
    offset = 2 + 2 * formats
    (count,) = struct.unpack_from(">h", rest, offset)
    offset += 2
    values: list[bytes | None] = []
    for _ in range(count):
        (size,) = struct.unpack_from(">i", rest, offset)
        offset += 4
        if size < 0:
            values.append(None)
            continue
        values.append(rest[offset : offset + size])
        offset += size
    return statement, values


def decode_uuids(value: bytes | None) -> list[UUID]:
    """A binary ``uuid`` or ``uuid[]`` parameter (or a text uuid) as a list of UUIDs."""
    if value is None:
        return []
    if len(value) == 16:
        return [UUID(bytes=value)]
    if len(value) >= 12 and int.from_bytes(value[8:12], "big") == _UUID_OID:
        dimensions = int.from_bytes(value[:4], "big")
        offset = 12 + 8 * dimensions
        found: list[UUID] = []
        while offset + 4 <= len(value):
            size = int.from_bytes(value[offset : offset + 4], "big", signed=True)
            offset += 4
            if size == 16:
                found.append(UUID(bytes=value[offset : offset + 16]))
            offset += max(size, 0)
        return found
    return [UUID(value.decode())]


_UUID_OID = 2950


@dataclass(eq=False)
class PgCommitCut:
    """When armed: lose the server's answer to the commit of the next guarded expire
    statement (the single one or the batched one).

    In autocommit the client sends Bind, Execute and Sync together and the server
    commits at Sync before it flushes its answer; inside BEGIN ... COMMIT the
    answer to COMMIT is the one lost. Either way the client is left with a
    committed transaction whose outcome it cannot know.
    """

    armed: bool = False
    fired: Link | None = None
    reservation_ids: list[UUID] = field(default_factory=list)
    _parsers: dict[int, PgFrontend] = field(default_factory=dict)
    _statements: dict[int, set[bytes]] = field(default_factory=dict)
    _in_transaction: set[int] = field(default_factory=set)
    _pending: dict[int, list[UUID]] = field(default_factory=dict)

    def __call__(self, link: Link, data: bytes) -> None:
        parser = self._parsers.setdefault(link.number, PgFrontend())
        for kind, body in parser.feed(data):
            if kind == b"P":
                self._on_parse(link, body)
            elif kind == b"Q":
                self._on_query(link, body)
            elif kind == b"B" and self.armed:
                self._on_bind(link, body)

    def _on_parse(self, link: Link, body: bytes) -> None:
        name, query = parse_statement(body)
        if all(marker in query for marker in EXPIRE_MARKERS):
            self._statements.setdefault(link.number, set()).add(name)

    def _on_query(self, link: Link, body: bytes) -> None:
        verb = body.lstrip().split(b" ", 1)[0].rstrip(b";\0").upper()
        if verb in (b"BEGIN", b"START"):
            self._in_transaction.add(link.number)
        elif verb in (b"COMMIT", b"END", b"ROLLBACK", b"ABORT"):
            self._in_transaction.discard(link.number)
            pending = self._pending.pop(link.number, None)
            if pending is not None and verb in (b"COMMIT", b"END"):
                self._fire(link, pending)

    def _on_bind(self, link: Link, body: bytes) -> None:
        statement, values = parse_bind(body)
        if statement not in self._statements.get(link.number, set()):
            return
        self.armed = False
        ids = decode_uuids(values[0] if values else None)
        if link.number in self._in_transaction:
            self._pending[link.number] = ids
        else:
            self._fire(link, ids)

    def _fire(self, link: Link, ids: list[UUID]) -> None:
        self.fired, self.reservation_ids = link, ids
        link.cut_on_reply = True


# --- AMQP 0-9-1 frames --------------------------------------------------------

_PROTOCOL_HEADER = 8
_FRAME_METHOD = 1
_BASIC_PUBLISH = b"\x00\x3c\x00\x28"  # class 60 (basic), method 40 (publish)
_BASIC_ACK = b"\x00\x3c\x00\x50"  # class 60 (basic), method 80 (ack)


class AmqpFrames:
    """Splits a client's byte stream into (frame type, channel, payload)."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.header_seen = False

    def feed(self, data: bytes) -> Iterator[tuple[int, int, bytes]]:
        """Add bytes; yield every complete frame."""
        self.buffer += data
        if not self.header_seen:
            if len(self.buffer) < _PROTOCOL_HEADER:
                return
            del self.buffer[:_PROTOCOL_HEADER]
            self.header_seen = True
        while len(self.buffer) >= 7:
            kind, channel, size = struct.unpack_from(">BHI", self.buffer, 0)
            if len(self.buffer) < 8 + size:
                return
            payload = bytes(self.buffer[7 : 7 + size])
            del self.buffer[: 8 + size]
            yield kind, channel, payload


@dataclass(eq=False)
class AmqpPublishTrap:
    """When armed: after ``after`` more ``basic.publish`` frames, hold replies or cut all."""

    proxy: TcpProxy | None = None
    action: Literal["hold", "cut"] = "hold"
    after: int = 1
    armed: bool = False
    publishes: int = 0
    fired_at_publish: int | None = None
    _parsers: dict[int, AmqpFrames] = field(default_factory=dict)

    def arm(self, action: Literal["hold", "cut"], after: int = 1) -> None:
        """Fire after ``after`` more publishes."""
        self.action, self.after, self.armed = action, self.publishes + after, True

    def __call__(self, link: Link, data: bytes) -> None:
        parser = self._parsers.setdefault(link.number, AmqpFrames())
        for kind, _channel, payload in parser.feed(data):
            if kind != _FRAME_METHOD or not payload.startswith(_BASIC_PUBLISH):
                continue
            self.publishes += 1
            if self.armed and self.publishes >= self.after:
                self.armed = False
                self.fired_at_publish = self.publishes
                self._fire(link)

    def _fire(self, link: Link) -> None:
        if self.action == "hold":
            link.hold_replies = True
        elif self.proxy is not None:
            self.proxy.cut()


@dataclass(eq=False)
class AmqpAckTrap:
    """The client's first ``basic.ack`` after a ``basic.publish``: call ``fire`` and drop it.

    A client that acks a delivery only after its own publish was confirmed (a replay)
    is thereby stopped exactly between the confirmed publish and the ack.
    """

    fire: Callable[[], None] = lambda: None
    armed: bool = True
    published: bool = False
    fired: bool = False
    _parsers: dict[int, AmqpFrames] = field(default_factory=dict)

    def __call__(self, link: Link, data: bytes) -> None:
        parser = self._parsers.setdefault(link.number, AmqpFrames())
        for kind, _channel, payload in parser.feed(data):
            if kind != _FRAME_METHOD:
                continue
            if payload.startswith(_BASIC_PUBLISH):
                self.published = True
            elif self.armed and self.published and payload.startswith(_BASIC_ACK):
                self.armed, self.fired = False, True
                self.fire()
                link.abort()
                return
