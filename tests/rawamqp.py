"""A bare AMQP 0-9-1 publisher that can put bytes on the wire no client library would.

A hostile publisher is not bound to a well-behaved client: it can send a
``message_id`` that is not UTF-8, a header key that is not UTF-8, or a
timestamp past the year 9999, and RabbitMQ passes them on untouched. This
speaks just enough of the protocol (pamqp marshals the frames) to publish
one such message with a publisher confirm; the test then patches the
marshalled content header's bytes.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from pamqp import commands, frame, header
from pamqp import heartbeat as pamqp_heartbeat
from pamqp.body import ContentBody

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_END = 0xCE

Patch = Callable[[bytes], bytes]


@dataclass(frozen=True)
class RawMessage:
    """One message to publish, and how to spoil its content header's bytes."""

    body: bytes
    properties: commands.Basic.Properties
    patch: Patch | None = None


async def _read_frame(reader: asyncio.StreamReader) -> object:
    head = await reader.readexactly(7)
    size = struct.unpack(">I", head[3:7])[0]
    rest = await reader.readexactly(size + 1)
    _consumed, _channel, value = frame.unmarshal(head + rest)
    if isinstance(value, pamqp_heartbeat.Heartbeat):
        return await _read_frame(reader)
    return value


async def _expect(reader: asyncio.StreamReader, kind: type[Any]) -> Any:
    value = await _read_frame(reader)
    if not isinstance(value, kind):
        raise AssertionError(f"expected {kind.__name__}, got {value!r}")  # noqa: TRY004
    return value


async def publish_raw_frames(
    amqp_url: str, exchange: str, routing_key: str, messages: list[RawMessage]
) -> None:
    """Publish ``messages`` (mandatory, with confirms); raise unless every one is acked."""
    parts = urlsplit(amqp_url)
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    user, password = unquote(parts.username or "guest"), unquote(parts.password or "guest")
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 5672)
    try:
        writer.write(PROTOCOL_HEADER)
        await _expect(reader, commands.Connection.Start)
        start_ok = commands.Connection.StartOk(
            client_properties={"product": "tests.rawamqp"},
            mechanism="PLAIN",
            response=f"\0{user}\0{password}",
            locale="en_US",
        )
        writer.write(frame.marshal(start_ok, 0))
        tune = await _expect(reader, commands.Connection.Tune)
        writer.write(frame.marshal(commands.Connection.TuneOk(tune.channel_max, tune.frame_max), 0))
        writer.write(frame.marshal(commands.Connection.Open(virtual_host=vhost), 0))
        await _expect(reader, commands.Connection.OpenOk)
        writer.write(frame.marshal(commands.Channel.Open(), 1))
        await _expect(reader, commands.Channel.OpenOk)
        writer.write(frame.marshal(commands.Confirm.Select(), 1))
        await _expect(reader, commands.Confirm.SelectOk)
        for message in messages:
            publish = commands.Basic.Publish(
                exchange=exchange, routing_key=routing_key, mandatory=True
            )
            content = frame.marshal(
                header.ContentHeader(0, len(message.body), message.properties), 1
            )
            if message.patch is not None:
                content = message.patch(content)
            writer.write(frame.marshal(publish, 1) + content)
            writer.write(frame.marshal(ContentBody(message.body), 1))
            answer = await _read_frame(reader)
            if not isinstance(answer, commands.Basic.Ack):
                raise AssertionError(f"the broker did not confirm a raw publish: {answer!r}")  # noqa: TRY004
        writer.write(frame.marshal(commands.Connection.Close(200, "bye", 0, 0), 0))
        await _expect(reader, commands.Connection.CloseOk)
    finally:
        writer.close()
        await writer.wait_closed()


def replace_bytes(old: bytes, new: bytes) -> Patch:
    """A patch that replaces ``old`` (found exactly once) with ``new`` of the same length."""
    if len(old) != len(new):
        raise ValueError("a patch must keep the frame's length")

    def patch(content: bytes) -> bytes:
        if content.count(old) != 1:
            raise AssertionError(f"{old!r} is not in the content header exactly once")
        return content.replace(old, new)

    return patch
