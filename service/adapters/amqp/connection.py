"""RabbitMQ connections and confirmed publishing."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aio_pika
import aiormq.exceptions
from aio_pika.abc import (
    AbstractChannel,
    AbstractExchange,
    AbstractMessage,
    AbstractRobustConnection,
)
from yarl import URL

from service.core.errors import PublishNotConfirmed
from service.core.redaction import redact
from service.core.tls_failures import refused, tls_failure
from service.settings import Settings

log = logging.getLogger(__name__)


def connection_url(url: str, *, heartbeat: int, name: str) -> URL:
    """``url`` with a heartbeat, a reconnect interval and a connection name.

    Values already in the URL's query win.
    """
    parsed = URL(url)
    query = {"heartbeat": str(heartbeat), "reconnect_interval": "2", "name": name}
    query.update(parsed.query)
    return parsed.with_query(query)


class ClusterConnection(aio_pika.RobustConnection):
    """A robust connection that moves to the next node when its node goes away.

    aio-pika reconnects to the URL it was given; with several nodes in
    ``AMQP_URL`` this one turns to the next node when the connection is lost
    (a close callback, which aio-pika runs before it reconnects), and keeps
    turning while reconnect attempts fail. Channels, queues and consumers are
    then restored on the new node as usual. It relies on aio-pika reading
    ``url`` at each reconnect (``internals.py`` lists it).
    """

    nodes: tuple[URL, ...] = ()
    node_index = 0
    _watchdog: asyncio.Task[None] | None = None

    def use_nodes(self, nodes: tuple[URL, ...], current: int) -> None:
        """Remember the cluster's nodes and which one this connection uses."""
        self.nodes, self.node_index = nodes, current
        if len(nodes) > 1 and self._watchdog is None:
            self.close_callbacks.add(self._next_node_on_loss)
            self._watchdog = asyncio.create_task(self._rotate_while_down())

    def _rotate(self) -> None:
        self.node_index = (self.node_index + 1) % len(self.nodes)
        self.url = self.nodes[self.node_index]
        log.warning("broker.next_node", extra={"url": redact(str(self.url))})

    def _next_node_on_loss(self, _sender: object, _exc: BaseException | None) -> None:
        """A close callback: a connection lost (not closed by us) reconnects to the next node."""
        if not self.close_called:
            self._rotate()

    async def _rotate_while_down(self) -> None:
        # A failed attempt retries the same URL: move on while we stay down.
        while not self.is_closed:
            await asyncio.sleep(self.reconnect_interval * 1.5)
            if not self.connected.is_set() and not self.is_closed:
                self._rotate()

    async def close(self, exc: Any = asyncio.CancelledError) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        await super().close(exc)


# What connecting to a node that does not answer raises. aiormq's handshake raises
# StopAsyncIteration (from its frame reader) when the peer closed before sending a
# frame, as a port that accepts and resets does (a dying node, a proxy that refuses).
UNREACHABLE = (OSError, aiormq.exceptions.AMQPError, TimeoutError, EOFError, StopAsyncIteration)


@contextlib.asynccontextmanager
async def connected(settings: Settings, *, name: str) -> AsyncIterator[AbstractRobustConnection]:
    """``connect`` for the block; the connection is closed at its end."""
    connection = await connect(settings, name=name)
    try:
        yield connection
    finally:
        await connection.close()


async def connect(settings: Settings, *, name: str) -> AbstractRobustConnection:
    """Connect to the first reachable node of ``AMQP_URL``; reconnects on loss, to
    the other nodes of the list too."""
    nodes = tuple(
        connection_url(url, heartbeat=settings.heartbeat_seconds, name=name)
        for url in settings.amqp_url
    )
    last: BaseException | None = None
    for index, url in enumerate(nodes):
        _say_unverified(url)
        try:
            connection = await _connect_node(url, settings.publish_timeout_seconds)
        except UNREACHABLE as exc:
            why = tls_failure(exc)
            if why is not None:  # a setting's fault: no other node or retry would help
                raise refused("AMQP_URL", f"RabbitMQ at {url.host}:{url.port}", why) from None
            log.warning(
                "broker.unreachable", extra={"url": redact(str(url)), "error": _describe(exc)}
            )
            last = exc
        else:
            connection.use_nodes(nodes, index)
            return connection
    listed = ", ".join(settings.amqp_url)
    raise ConnectionError(redact(f"cannot reach RabbitMQ at {listed}: {_describe(last)}")) from last


def _say_unverified(url: URL) -> None:
    if url.scheme == "amqps" and url.query.get("no_verify_ssl", "0") != "0":
        log.warning(
            "broker.tls_unverified",
            extra={
                "host": url.host,
                "reason": "AMQP_URL has no_verify_ssl=1: the broker's certificate is not "
                "checked, so anyone on the path can stand in for it",
            },
        )


async def _connect_node(url: URL, timeout: float) -> ClusterConnection:
    """One node's robust connection, or none at all: an attempt that fails or is
    cancelled (a SIGTERM while connecting) closes it, so that it does not go on
    reconnecting in the background (``aio_pika.connect_robust`` would)."""
    connection = ClusterConnection(url)
    try:
        await connection.connect(timeout=timeout)
    except BaseException:
        with contextlib.suppress(Exception):
            await asyncio.shield(connection.close())
        raise
    return connection


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "no node given"
    return str(exc).strip() or type(exc).__name__


async def open_confirm_channel(connection: AbstractRobustConnection) -> AbstractChannel:
    """A channel with publisher confirms on which an unroutable publish raises."""
    return await connection.channel(publisher_confirms=True, on_return_raises=True)


async def publish_confirmed(
    exchange: AbstractExchange,
    message: AbstractMessage,
    routing_key: str,
    *,
    timeout: float | None,
) -> None:
    """Publish mandatory and wait for the broker's confirm, or raise ``PublishNotConfirmed``."""
    try:
        await exchange.publish(message, routing_key, mandatory=True, timeout=timeout)
    except asyncio.CancelledError as exc:
        if _cancelling():
            raise
        raise PublishNotConfirmed(not_confirmed_reason(exc, timeout)) from exc
    except CHANNEL_ERRORS as exc:  # returned and nacked ones too: AMQPErrors
        raise PublishNotConfirmed(not_confirmed_reason(exc, timeout)) from exc


# What a channel's calls (a publish, an ack, a cancel) raise when the broker can no
# longer be told: the channel or its connection is gone, or the broker refused.
CHANNEL_ERRORS = (aiormq.exceptions.ChannelInvalidStateError, aiormq.exceptions.AMQPError, OSError)


def not_confirmed_reason(exc: BaseException, timeout: float | None) -> str:
    """Why a publish was not confirmed, from what it raised: returned, nacked, no confirm
    within ``timeout``, or its channel lost."""
    if isinstance(exc, aiormq.exceptions.PublishError):
        return f"unroutable: returned by the broker ({exc})"
    if isinstance(exc, aiormq.exceptions.DeliveryError):
        return "nacked by the broker"
    if isinstance(exc, TimeoutError | asyncio.CancelledError):
        return f"no confirm within {timeout or 0:g}s"
    return f"channel lost before the confirm ({type(exc).__name__})"


SettleAction = Callable[[], Awaitable[None]]


async def settle(action: SettleAction, message_id: str) -> bool:
    """Ack or nack a delivery; never on a channel that was replaced after a reconnect.

    Returns whether the broker was told; a False leaves the delivery to be
    redelivered (every handler is safe to repeat).
    """
    try:
        await action()
    except CHANNEL_ERRORS as exc:
        settle_failed(exc, message_id)
        return False
    return True


def settle_failed(exc: BaseException, message_id: str) -> None:
    """Log why a delivery could not be settled (it will be redelivered)."""
    if isinstance(exc, aiormq.exceptions.ChannelInvalidStateError):
        # The delivery belongs to a channel that is gone: its tag is void, and
        # the broker redelivers the message (the guarded update makes that safe).
        log.warning("expiry.stale_delivery", extra={"message_id": message_id})
    else:
        log.warning(
            "expiry.settle_failed", extra={"message_id": message_id, "error": type(exc).__name__}
        )


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
