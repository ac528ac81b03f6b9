"""RabbitMQ connections and confirmed publishing."""

from __future__ import annotations

import asyncio
import logging

import aio_pika
import aiormq.exceptions
from aio_pika.abc import (
    AbstractChannel,
    AbstractExchange,
    AbstractMessage,
    AbstractRobustConnection,
)
from yarl import URL

from service.errors import PublishNotConfirmed
from service.settings import Settings
from service.telemetry import redact

log = logging.getLogger(__name__)


def connection_url(url: str, *, heartbeat: int, name: str) -> URL:
    """``url`` with a heartbeat, a reconnect interval and a connection name.

    Values already in the URL's query win.
    """
    parsed = URL(url)
    query = {"heartbeat": str(heartbeat), "reconnect_interval": "2", "name": name}
    query.update(parsed.query)
    return parsed.with_query(query)


async def connect(settings: Settings, *, name: str) -> AbstractRobustConnection:
    """Connect to the first reachable node of ``AMQP_URL``; reconnects on loss."""
    last: BaseException | None = None
    for url in settings.amqp_url:
        try:
            return await aio_pika.connect_robust(
                connection_url(url, heartbeat=settings.heartbeat_seconds, name=name),
                timeout=settings.publish_timeout_seconds,
            )
        except (OSError, aiormq.exceptions.AMQPError, TimeoutError) as exc:
            log.warning("broker.unreachable", extra={"url": redact(url), "error": _describe(exc)})
            last = exc
    nodes = ", ".join(redact(url) for url in settings.amqp_url)
    raise ConnectionError(f"cannot reach RabbitMQ at {nodes}: {_describe(last)}") from last


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "no node given"
    return str(exc).strip() or type(exc).__name__


async def open_confirm_channel(connection: AbstractRobustConnection) -> AbstractChannel:
    """A channel with publisher confirms on which an unroutable publish raises."""
    return await connection.channel(publisher_confirms=True, on_return_raises=True)


async def publish_confirmed(
    exchange: AbstractExchange, message: AbstractMessage, routing_key: str, *, timeout: float
) -> None:
    """Publish mandatory and wait for the broker's confirm, or raise ``PublishNotConfirmed``."""
    try:
        await exchange.publish(message, routing_key, mandatory=True, timeout=timeout)
    except aiormq.exceptions.PublishError as exc:
        raise PublishNotConfirmed(f"unroutable: returned by the broker ({exc})") from exc
    except aiormq.exceptions.DeliveryError as exc:
        raise PublishNotConfirmed("nacked by the broker") from exc
    except (TimeoutError, asyncio.CancelledError) as exc:
        if isinstance(exc, asyncio.CancelledError) and _cancelling():
            raise
        raise PublishNotConfirmed(f"no confirm within {timeout:g}s") from exc
    except (
        aiormq.exceptions.AMQPError,
        aiormq.exceptions.ChannelInvalidStateError,
        OSError,
    ) as exc:
        raise PublishNotConfirmed(
            f"channel lost before the confirm ({type(exc).__name__})"
        ) from exc


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
