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
marshalled by pamqp). A message that carries a ``traceparent`` (the relay's events: the
trace of their expiry) gets its span as a child of it; a publisher made with
``continued_only`` (the relay's) starts spans for those alone, so that a message of no
trace costs nothing.

The relay publishes its events the same way (``service/relay/``): a page is any run of
messages to one exchange and routing key, each with its body, its stable message id and
the ``type`` property of its publisher (``expire`` for a command, ``reservation.expired``
for an event).
"""

from __future__ import annotations

import asyncio
import functools
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

import aiormq
import aiormq.abc
import aiormq.exceptions
from aio_pika.abc import AbstractChannel
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from pamqp import commands as spec
from pamqp import frame as pamqp_frame
from pamqp.header import ContentHeader

from service.adapters.amqp import internals
from service.adapters.amqp.connection import CHANNEL_ERRORS, not_confirmed_reason
from service.adapters.amqp.messages import APP_ID, COMMAND_TYPE, CONTENT_TYPE
from service.adapters.telemetry.propagation import carrier_for, parent_of
from service.adapters.telemetry.recording import Recorder

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
    """One message to publish (a command, or an event): its body, its stable message id,
    and the trace it continues (a W3C ``traceparent``), if any."""

    body: bytes
    message_id: str
    traceparent: str | None = None


def _short_str(text: str) -> bytes | None:
    data = text.encode()
    return bytes((len(data),)) + data if len(data) <= 255 else None


_CONTENT_TYPE = _short_str(CONTENT_TYPE) or b""
_APP = _short_str(APP_ID) or b""


@functools.cache
def _type_and_app(message_type: str) -> bytes:
    """The type and app-id properties as a header frame holds them (a short string each)."""
    return (_short_str(message_type) or b"") + _APP


def publish_frame(
    channel_number: int, exchange: str, routing_key: str, *, mandatory: bool = True
) -> bytes:
    """The ``basic.publish`` method frame (mandatory unless told), the same for every
    command."""
    method = spec.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=mandatory)
    return pamqp_frame.marshal(method, channel_number)


def properties_of(
    message_id: str,
    headers: dict[str, Any] | None = None,
    message_type: str = COMMAND_TYPE,
) -> spec.Basic.Properties:
    """A message's properties: persistent JSON with its stable id, its type and our app id."""
    return spec.Basic.Properties(
        content_type=CONTENT_TYPE,
        delivery_mode=PERSISTENT,
        message_id=message_id,
        message_type=message_type,
        app_id=APP_ID,
        headers=headers,
    )


def header_frame(channel_number: int, command: Command, message_type: str = COMMAND_TYPE) -> bytes:
    """A message's content header frame, byte for byte what pamqp marshals for
    ``properties_of(command.message_id, None, message_type)``, built from a template."""
    message_id = _short_str(command.message_id)
    if message_id is None or len(message_type.encode()) > 255:
        properties = properties_of(command.message_id, None, message_type)
        header = ContentHeader(body_size=len(command.body), properties=properties)
        return pamqp_frame.marshal(header, channel_number)
    payload = b"".join(
        (
            _HEADER_HEAD.pack(BASIC_CLASS, 0, len(command.body), COMMAND_FLAGS),
            _CONTENT_TYPE,
            b"\x02",
            message_id,
            _type_and_app(message_type),
        )
    )
    return _FRAME_HEAD.pack(HEADER_FRAME, channel_number, len(payload)) + payload + FRAME_END


def body_frame(channel_number: int, body: bytes) -> bytes:
    """A body frame holding all of ``body`` (it must fit in one frame)."""
    return _FRAME_HEAD.pack(BODY_FRAME, channel_number, len(body)) + body + FRAME_END


def command_frames(
    channel_number: int,
    method: bytes,
    command: Command,
    headers: dict[str, Any] | None,
    message_type: str = COMMAND_TYPE,
) -> bytes:
    """The three frames of one message (its header marshalled by pamqp when it carries
    headers)."""
    if headers is None:
        header = header_frame(channel_number, command, message_type)
    else:
        properties = properties_of(command.message_id, headers, message_type)
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
    """Pages of messages to one exchange and routing key, on a confirm channel of a
    robust connection (the aiormq channel under it at the time of each page), each of
    type ``message_type``; with ``continued_only``, spans only for the messages that carry
    a ``traceparent``."""

    channel: AbstractChannel
    exchange: str
    routing_key: str
    recorder: Recorder | None = None  # None: no spans
    message_type: str = COMMAND_TYPE
    continued_only: bool = False
    # Mandatory: a message no queue takes is returned (and so not confirmed). Without, the
    # broker confirms and drops it (the events with EXPIRY_EVENTS_UNROUTABLE=drop).
    mandatory: bool = True

    async def publish(self, commands: Sequence[Command], *, timeout: float) -> list[str | None]:
        """Publish ``commands`` (mandatory, persistent) and wait at most ``timeout`` seconds,
        from now, until the broker has them: per command ``None`` once the broker confirmed
        it, else why it did not (returned, nacked, no confirm in time, the channel lost)."""
        if not commands:
            return []
        deadline = asyncio.get_running_loop().time() + timeout
        spans, headers = self._start_spans(commands)
        underlay: aiormq.abc.AbstractChannel | None = None
        try:
            async with asyncio.timeout_at(deadline):
                underlay = await self.channel.get_underlay_channel()
                confirmations = await _publish(underlay, self, commands, headers)
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

    def _start_spans(
        self, commands: Sequence[Command]
    ) -> tuple[list[trace.Span | None], list[dict[str, Any] | None]]:
        """A producer span per message (none when not tracing, nor, ``continued_only``, for
        a message of no trace) and the headers that carry its context."""
        if self.recorder is None:
            return [], [None] * len(commands)
        spans: list[trace.Span | None] = []
        headers: list[dict[str, Any] | None] = []
        for command in commands:
            parent = parent_of(command.traceparent)
            if parent is None and self.continued_only:
                spans.append(None)
                headers.append(None)
                continue
            span = _producer_span(self.recorder, self.exchange, self.routing_key, command, parent)
            spans.append(span)
            headers.append(carrier_for(span) or None)
        return spans, headers


async def _publish(
    channel: aiormq.abc.AbstractChannel,
    publisher: PagePublisher,
    commands: Sequence[Command],
    headers: Sequence[dict[str, Any] | None],
) -> list[asyncio.Future[Any]]:
    """Each message's confirmation, its frames written with the page's (or, where the
    channel does not allow that, published one by one)."""
    if supports_pages(channel) and all(
        len(command.body) < channel.max_content_size for command in commands
    ):
        return await _write_page(channel, publisher, commands, headers)
    return [
        asyncio.ensure_future(
            channel.basic_publish(
                command.body,
                exchange=publisher.exchange,
                routing_key=publisher.routing_key,
                properties=properties_of(command.message_id, extra, publisher.message_type),
                mandatory=publisher.mandatory,
            )
        )
        for command, extra in zip(commands, headers, strict=True)
    ]


async def _write_page(
    channel: aiormq.Channel,
    publisher: PagePublisher,
    commands: Sequence[Command],
    headers: Sequence[dict[str, Any] | None],
) -> list[asyncio.Future[Any]]:
    """The page's frames as one write, its delivery tags and confirmations registered as
    ``basic_publish`` registers one command's, under the channel's lock."""
    number = channel.number
    method = publish_frame(
        number, publisher.exchange, publisher.routing_key, mandatory=publisher.mandatory
    )
    kind = publisher.message_type
    payload = b"".join(
        command_frames(number, method, command, extra, kind)
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


def _producer_span(
    recorder: Recorder,
    exchange: str,
    routing_key: str,
    command: Command,
    parent: trace.SpanContext | None,
) -> trace.Span:
    """The producer span of one message, a child of ``parent`` (else of the current
    context), with the messaging attributes."""
    return recorder.start(
        f"{exchange} publish",
        SpanKind.PRODUCER,
        {
            "messaging.system": "rabbitmq",
            "messaging.operation.type": "send",
            "messaging.operation.name": "publish",
            "messaging.destination.name": exchange,
            "messaging.rabbitmq.destination.routing_key": routing_key,
            "messaging.message.id": command.message_id,
        },
        parent=parent,
    )


def _end_spans(spans: Sequence[trace.Span | None], outcomes: Sequence[str | None]) -> None:
    for span, why in zip(spans, outcomes, strict=False):
        if span is None:
            continue
        if why is not None:
            span.set_attribute("error.type", "unconfirmed")
            span.set_status(Status(StatusCode.ERROR, why))
        span.end()
