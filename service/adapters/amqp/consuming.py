"""Consuming the work queue on aiormq, the layer aio-pika is built on.

aio-pika hands each delivery to its callback as an ``IncomingMessage`` (some twenty
attributes, each set through a checked ``__setattr__``) in a task of its own, on top
of the task aiormq already runs per delivery, a cost paid on every delivery (figures:
docs/benchmark.md#the-work-queue-on-aiormq). Here a message is a ``FrameMessage``: aiormq's
message, read where it is read (a few slots, the properties looked up only when asked
for), settled on the channel it came on.

``QueueConsumer`` is the ``basic.consume`` that aio-pika's robust queue would have kept:
it consumes on the aiormq channel under a robust aio-pika channel and consumes again
after that channel was reopened (a reconnect, to another node too: the robust
channel restores its QoS first) or after the broker cancelled it (the queue deleted,
say: it tries again every ``RETRY_SECONDS`` until the queue is back). A delivery is
always settled on its own channel: once that is gone its tag is void, ``channel``
raises ``ChannelInvalidStateError`` and the broker redelivers it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any, Protocol

import aiormq
import aiormq.abc
import aiormq.exceptions
from aio_pika.abc import AbstractRobustChannel
from pamqp import commands as spec

log = logging.getLogger(__name__)

RETRY_SECONDS = 2.0  # between attempts to consume again (the broker cancelled us, or refused)
REOPEN_POLL_SECONDS = 0.05  # while the robust channel has not yet replaced a closed one


class AmqpMessage(Protocol):
    """A message as the broker delivered it: what the consumer reads of it, and how it
    settles it alone (``FrameMessage``, and aio-pika's ``IncomingMessage`` too). Its
    handling is the worker's ``Delivery``."""

    @property
    def body(self) -> bytes: ...
    @property
    def headers(self) -> Mapping[str, Any] | None: ...
    @property
    def message_id(self) -> str | None: ...
    @property
    def redelivered(self) -> bool | None: ...
    @property
    def exchange(self) -> str | None: ...
    @property
    def routing_key(self) -> str | None: ...
    @property
    def delivery_tag(self) -> int | None: ...
    @property
    def content_type(self) -> str | None: ...
    @property
    def content_encoding(self) -> str | None: ...
    @property
    def correlation_id(self) -> str | None: ...
    @property
    def timestamp(self) -> datetime | None: ...
    @property
    def type(self) -> str | None: ...
    @property
    def app_id(self) -> str | None: ...
    @property
    def channel(self) -> aiormq.abc.AbstractChannel: ...

    async def ack(self) -> None: ...

    async def reject(self, requeue: bool = False) -> None: ...


class FrameMessage:
    """One message as aiormq read it off the wire (an ``AmqpMessage``)."""

    __slots__ = (
        "_channel",
        "_properties",
        "body",
        "delivery_tag",
        "exchange",
        "redelivered",
        "routing_key",
    )

    def __init__(self, message: aiormq.abc.DeliveredMessage) -> None:
        deliver = message.delivery
        self.body: bytes = message.body
        self._channel = message.channel
        self._properties = message.header.properties
        self.delivery_tag: int | None = getattr(deliver, "delivery_tag", None)
        self.redelivered: bool | None = getattr(deliver, "redelivered", None)
        self.exchange: str | None = getattr(deliver, "exchange", None)
        self.routing_key: str | None = getattr(deliver, "routing_key", None)

    @property
    def headers(self) -> Mapping[str, Any] | None:
        return self._properties.headers

    @property
    def message_id(self) -> str | None:
        return self._properties.message_id

    @property
    def content_type(self) -> str | None:
        return self._properties.content_type

    @property
    def content_encoding(self) -> str | None:
        return self._properties.content_encoding

    @property
    def correlation_id(self) -> str | None:
        return self._properties.correlation_id

    @property
    def timestamp(self) -> datetime | None:
        return self._properties.timestamp

    @property
    def type(self) -> str | None:
        return self._properties.message_type

    @property
    def app_id(self) -> str | None:
        return self._properties.app_id

    @property
    def channel(self) -> aiormq.abc.AbstractChannel:
        """The channel it came on; ``ChannelInvalidStateError`` once that is closed."""
        if self._channel.is_closed:
            raise aiormq.exceptions.ChannelInvalidStateError("the delivery's channel is closed")
        return self._channel

    async def ack(self) -> None:
        """``basic.ack`` of this delivery alone."""
        await self.channel.basic_ack(self._tag())

    async def reject(self, requeue: bool = False) -> None:
        """``basic.reject``: back to the queue, or (``requeue=False``) dead-lettered by it."""
        await self.channel.basic_reject(self._tag(), requeue=requeue)

    def _tag(self) -> int:
        if self.delivery_tag is None:
            raise aiormq.exceptions.ChannelInvalidStateError("a delivery without a tag")
        return self.delivery_tag


OnMessage = Callable[[FrameMessage], Awaitable[None]]


class QueueConsumer:
    """``basic.consume`` of one queue on aiormq, kept across reconnects and broker cancels."""

    def __init__(self, channel: AbstractRobustChannel, queue: str, on_message: OnMessage) -> None:
        self.channel = channel
        self.queue = queue
        self.on_message = on_message
        self._underlay: aiormq.abc.AbstractChannel | None = None
        self._tag: str | None = None
        self._cancelled = asyncio.Event()  # the broker cancelled the consumer
        self._keeper: asyncio.Task[None] | None = None

    @property
    def consuming(self) -> bool:
        """Whether the broker has our consumer on a channel that is open."""
        underlay = self._underlay
        return self._tag is not None and underlay is not None and not underlay.is_closed

    async def start(self) -> None:
        """Consume now (raising what the broker answers if it refuses), and keep consuming."""
        await self._consume()
        self._keeper = asyncio.create_task(self._keep())

    async def cancel(self) -> None:
        """Stop consuming (``basic.cancel``); what the broker had already sent still
        arrives and is handled."""
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
        underlay, tag, self._tag = self._underlay, self._tag, None
        if underlay is not None and tag is not None and not underlay.is_closed:
            await underlay.basic_cancel(tag)

    async def _consume(self) -> None:
        underlay = await self._open_channel()
        self._cancelled.clear()
        underlay.on_consumer_cancel_callbacks.add(self._on_cancel)
        ok = await underlay.basic_consume(self.queue, self._deliver)
        self._underlay, self._tag = underlay, ok.consumer_tag

    async def _open_channel(self) -> aiormq.abc.AbstractChannel:
        """The robust channel's aiormq channel once it is open and restored (its QoS set)."""
        while True:
            await self.channel.ready()
            underlay = await self.channel.get_underlay_channel()
            if not underlay.is_closed:
                return underlay
            await asyncio.sleep(REOPEN_POLL_SECONDS)  # closed, not yet seen by the robust one

    async def _deliver(self, message: aiormq.abc.DeliveredMessage) -> None:
        await self.on_message(FrameMessage(message))

    def _on_cancel(self, frame: spec.Basic.Cancel) -> None:
        if frame.consumer_tag is not None and frame.consumer_tag == self._tag:
            self._tag = None
            self._cancelled.set()
            log.warning("broker.consumer_cancelled", extra={"queue": self.queue})

    async def _keep(self) -> None:
        """Consume again whenever the channel was replaced or the broker cancelled us."""
        while True:
            underlay = self._underlay
            assert underlay is not None  # set by the consume that started us
            await self._until_lost(underlay)
            self._tag = None
            pause = RETRY_SECONDS if self._cancelled.is_set() else 0.0
            while True:
                await asyncio.sleep(pause)
                try:
                    await self._consume()
                except Exception as exc:  # any failure: a consumer that stops trying is an outage
                    log.warning(
                        "broker.consume_failed",
                        extra={"queue": self.queue, "error": type(exc).__name__},
                    )
                    pause = RETRY_SECONDS
                else:
                    log.info("broker.consuming_again", extra={"queue": self.queue})
                    break

    async def _until_lost(self, underlay: aiormq.abc.AbstractChannel) -> None:
        """Until ``underlay`` closes or the broker cancels the consumer on it."""
        closing = underlay.closing
        cancelled = asyncio.ensure_future(self._cancelled.wait())
        try:
            await asyncio.wait((closing, cancelled), return_when=asyncio.FIRST_COMPLETED)
        finally:
            closing.cancel()
            cancelled.cancel()
