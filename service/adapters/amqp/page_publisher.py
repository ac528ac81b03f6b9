"""A page of expiration commands published on aiormq in one write, each confirmed alone.

Published one by one (aio-pika's ``Exchange.publish``), each command cost a message
object, a task, aiormq's lock and timeout, two futures, a frame through the
connection's write queue and a ``send()`` of its own, the bulk of the scan's time
(figures: docs/benchmark.md#a-page-of-commands-in-one-write). Here a page's frames are built
as bytes (``command_frames``: the publish method frame once per page, a header frame
from a template, the body) and handed to aiormq's writer as one: a ``send()`` or a few
for the whole page. Each command still has its own delivery tag and its own confirm,
return or nack, which aiormq's reader resolves as it does for its ``basic_publish``.

It uses what aiormq's own ``basic_publish`` uses of a channel (its lock, its
delivery-tag counter, its confirmations, the connection's write queue), which aiormq
does not document (``internals.py`` lists each). ``supports_pages`` allows a page only
on the aiormq releases it was checked on, on aiormq's own channel class, with those
attributes there; anywhere else the page is published one by one through
``basic_publish``. Either way the outcome is the same: per command, confirmed or the
reason it was not.

With tracing on, each command gets its producer span (``expirations publish``), ended
at its confirm, and carries its context in its headers (the header frame is then
marshalled by pamqp).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

import aiormq
import aiormq.abc
import aiormq.exceptions
from aio_pika.abc import AbstractChannel
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from pamqp import commands as spec
from pamqp import frame as pamqp_frame
from pamqp.header import ContentHeader

from service.adapters.amqp import internals
from service.adapters.amqp.connection import CHANNEL_ERRORS, not_confirmed_reason
from service.adapters.amqp.messages import APP_ID, COMMAND_TYPE, CONTENT_TYPE

FRAME_END = b"\xce"
HEADER_FRAME, BODY_FRAME = 2, 3
BASIC_CLASS = 60
PERSISTENT = 2
# Property flags of a command: content-type, delivery-mode, message-id, type, app-id.
COMMAND_FLAGS = 0x8000 | 0x1000 | 0x0080 | 0x0020 | 0x0008
_FRAME_HEAD = struct.Struct(">BHI")
_HEADER_HEAD = struct.Struct(">HHQH")


@dataclass(frozen=True)
class Command:
    """One command to publish: its body and its stable message id."""

    body: bytes
    message_id: str


def _short_str(text: str) -> bytes | None:
    data = text.encode()
    return bytes((len(data),)) + data if len(data) <= 255 else None


_CONTENT_TYPE = _short_str(CONTENT_TYPE) or b""
_TYPE_AND_APP = (_short_str(COMMAND_TYPE) or b"") + (_short_str(APP_ID) or b"")


def publish_frame(channel_number: int, exchange: str, routing_key: str) -> bytes:
    """The ``basic.publish`` method frame (mandatory), the same for every command."""
    method = spec.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=True)
    return pamqp_frame.marshal(method, channel_number)


def properties_of(message_id: str, headers: dict[str, Any] | None = None) -> spec.Basic.Properties:
    """A command's properties: persistent JSON with its stable id, our type and app id."""
    return spec.Basic.Properties(
        content_type=CONTENT_TYPE,
        delivery_mode=PERSISTENT,
        message_id=message_id,
        message_type=COMMAND_TYPE,
        app_id=APP_ID,
        headers=headers,
    )


def header_frame(channel_number: int, command: Command) -> bytes:
    """A command's content header frame, byte for byte what pamqp marshals for
    ``properties_of(command.message_id)``, built from a template."""
    message_id = _short_str(command.message_id)
    if message_id is None:
        header = ContentHeader(
            body_size=len(command.body), properties=properties_of(command.message_id)
        )
        return pamqp_frame.marshal(header, channel_number)
    payload = b"".join(
        (
            _HEADER_HEAD.pack(BASIC_CLASS, 0, len(command.body), COMMAND_FLAGS),
            _CONTENT_TYPE,
            b"\x02",
            message_id,
            _TYPE_AND_APP,
        )
    )
    return _FRAME_HEAD.pack(HEADER_FRAME, channel_number, len(payload)) + payload + FRAME_END


def body_frame(channel_number: int, body: bytes) -> bytes:
    """A body frame holding all of ``body`` (it must fit in one frame)."""
    return _FRAME_HEAD.pack(BODY_FRAME, channel_number, len(body)) + body + FRAME_END


def command_frames(
    channel_number: int, method: bytes, command: Command, headers: dict[str, Any] | None
) -> bytes:
    """The three frames of one command (its header marshalled by pamqp when it carries
    headers)."""
    if headers is None:
        header = header_frame(channel_number, command)
    else:
        properties = properties_of(command.message_id, headers)
        content = ContentHeader(body_size=len(command.body), properties=properties)
        header = pamqp_frame.marshal(content, channel_number)
    return method + header + body_frame(channel_number, command.body)


def supports_pages(channel: object) -> TypeGuard[aiormq.Channel]:
    """Whether a page may be written on ``channel``: the installed aiormq is one this was
    checked on (``internals.AIORMQ``), and ``channel`` is its confirm channel with what
    ``basic_publish`` uses."""
    return (
        internals.pages_allowed()
        and isinstance(channel, aiormq.Channel)
        and getattr(channel, "publisher_confirms", False) is True
        and isinstance(getattr(channel, "delivery_tag", None), int)
        and isinstance(getattr(channel, "confirmations", None), dict)
        and isinstance(getattr(channel, "message_id_delivery_tag", None), dict)
        and isinstance(getattr(channel, "write_queue", None), asyncio.Queue)
        and isinstance(getattr(channel, "max_content_size", None), int)
        and isinstance(getattr(channel, "number", None), int)
        and hasattr(channel, "lock")
    )


@dataclass(eq=False)
class PagePublisher:
    """Pages of commands to one exchange and routing key, on a confirm channel of a
    robust connection (the aiormq channel under it at the time of each page)."""

    channel: AbstractChannel
    exchange: str
    routing_key: str
    tracer: trace.Tracer | None = None

    async def publish(self, commands: Sequence[Command], *, timeout: float) -> list[str | None]:
        """Publish ``commands`` (mandatory, persistent) and wait at most ``timeout`` seconds,
        from now, until the broker has them: per command ``None`` once the broker confirmed
        it, else why it did not (returned, nacked, no confirm in time, the channel lost)."""
        if not commands:
            return []
        deadline = asyncio.get_running_loop().time() + timeout
        spans, headers = _start_spans(self.tracer, self.exchange, self.routing_key, commands)
        underlay: aiormq.abc.AbstractChannel | None = None
        try:
            async with asyncio.timeout_at(deadline):
                underlay = await self.channel.get_underlay_channel()
                confirmations = await _publish(
                    underlay, self.exchange, self.routing_key, commands, headers
                )
            outcomes = await _outcomes(confirmations, deadline, timeout)
        except CHANNEL_ERRORS as exc:  # the deadline (a TimeoutError) too
            outcomes = [not_confirmed_reason(exc, timeout)] * len(commands)
        except BaseException:
            _end_spans(spans, ["cancelled"] * len(commands))
            raise
        finally:
            if underlay is not None:
                _forget(underlay, commands)
        _end_spans(spans, outcomes)
        return outcomes


async def _publish(
    channel: aiormq.abc.AbstractChannel,
    exchange: str,
    routing_key: str,
    commands: Sequence[Command],
    headers: Sequence[dict[str, Any] | None],
) -> list[asyncio.Future[Any]]:
    """Each command's confirmation, its frames written with the page's (or, where the
    channel does not allow that, published one by one)."""
    if supports_pages(channel) and all(
        len(command.body) < channel.max_content_size for command in commands
    ):
        return await _write_page(channel, exchange, routing_key, commands, headers)
    return [
        asyncio.ensure_future(
            channel.basic_publish(
                command.body,
                exchange=exchange,
                routing_key=routing_key,
                properties=properties_of(command.message_id, extra),
                mandatory=True,
            )
        )
        for command, extra in zip(commands, headers, strict=True)
    ]


async def _write_page(
    channel: aiormq.Channel,
    exchange: str,
    routing_key: str,
    commands: Sequence[Command],
    headers: Sequence[dict[str, Any] | None],
) -> list[asyncio.Future[Any]]:
    """The page's frames as one write, its delivery tags and confirmations registered as
    ``basic_publish`` registers one command's, under the channel's lock."""
    number = channel.number
    method = publish_frame(number, exchange, routing_key)
    payload = b"".join(
        command_frames(number, method, command, extra)
        for command, extra in zip(commands, headers, strict=True)
    )
    async with channel.lock:
        first = channel.delivery_tag + 1
        futures: list[asyncio.Future[Any]] = []
        for tag, command in enumerate(commands, start=first):
            future = channel.create_future()
            channel.confirmations[tag] = future
            channel.message_id_delivery_tag[command.message_id] = tag
            futures.append(future)
        channel.delivery_tag = first + len(commands) - 1
        drain = channel.create_future()
        queued = False
        try:
            frame = aiormq.abc.ChannelFrame(payload=payload, should_close=False, drain_future=drain)
            await channel.write_queue.put(frame)
            queued = True
            await drain
        except BaseException:
            if not queued:  # the broker never saw them: their tags are free again
                channel.delivery_tag = first - 1
                for tag in range(first, first + len(commands)):
                    channel.confirmations.pop(tag, None)
            for future in (drain, *futures):
                future.cancel()
            raise
    return futures


async def _outcomes(
    confirmations: list[asyncio.Future[Any]], deadline: float, timeout: float
) -> list[str | None]:
    """Wait for the confirmations until ``deadline``; why each one failed, if it did."""
    remaining = max(0.0, deadline - asyncio.get_running_loop().time())
    _done, late = await asyncio.wait(confirmations, timeout=remaining)
    for future in late:
        future.cancel()
    if late:
        await asyncio.wait(late)
    return [_reason(future, timeout) for future in confirmations]


def _reason(future: asyncio.Future[Any], timeout: float) -> str | None:
    if future.cancelled():  # by ``_outcomes``, at the deadline
        return not_confirmed_reason(TimeoutError(), timeout)
    error = future.exception()
    if error is not None:
        return not_confirmed_reason(error, timeout)
    if isinstance(future.result(), spec.Basic.Ack):
        return None
    return "unroutable: returned by the broker"  # a channel that returns without raising


def _forget(channel: object, commands: Sequence[Command]) -> None:
    """Drop the page's message ids from the channel's lookup of returns (as
    ``basic_publish`` does once a command's confirmation is done)."""
    lookup = getattr(channel, "message_id_delivery_tag", None)
    if isinstance(lookup, dict):
        for command in commands:
            lookup.pop(command.message_id, None)


def _start_spans(
    tracer: trace.Tracer | None, exchange: str, routing_key: str, commands: Sequence[Command]
) -> tuple[list[trace.Span], list[dict[str, Any] | None]]:
    """A producer span per command and the headers that carry its context (none when
    not tracing)."""
    if tracer is None:
        return [], [None] * len(commands)
    spans: list[trace.Span] = []
    headers: list[dict[str, Any] | None] = []
    for command in commands:
        span = tracer.start_span(
            f"{exchange} publish",
            kind=SpanKind.PRODUCER,
            attributes={
                "messaging.system": "rabbitmq",
                "messaging.operation.type": "send",
                "messaging.operation.name": "publish",
                "messaging.destination.name": exchange,
                "messaging.rabbitmq.destination.routing_key": routing_key,
                "messaging.message.id": command.message_id,
            },
        )
        carrier: dict[str, Any] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        spans.append(span)
        headers.append(carrier or None)
    return spans, headers


def _end_spans(spans: Sequence[trace.Span], outcomes: Sequence[str | None]) -> None:
    for span, why in zip(spans, outcomes, strict=False):
        if why is not None:
            span.set_attribute("error.type", "unconfirmed")
            span.set_status(Status(StatusCode.ERROR, why))
        span.end()
