"""Giving a dead letter back to its queue without ever losing it.

The dead-letter queues (``expirations.dead``, ``expirations.dead.log``) have
a delivery limit like every quorum queue (set far above any normal use, and
RabbitMQ 4 would apply 20 otherwise), and no queue behind them: a message
returned to one of them more times than the limit would be dropped. Their
readers return messages as part of their job (a replay takes every message
of ``expirations.dead`` and returns those it does not replay; the recorder
returns one while the database is away), so after enough replays or a long
outage any dead letter could reach the limit.

``give_back`` therefore returns a message with ``basic.reject`` (which
counts as a delivery on every RabbitMQ version: 4.3 stopped counting
``basic.nack``) while its count is low, and once the count reaches
``REFRESH_AT`` replaces it instead: a fresh copy (same body, properties and
headers, minus the broker's count) is published with a confirm to that queue
alone (the dead exchange routes each queue's own name to it), and only then
is the original acked. A copy the broker does not confirm leaves the
original to be returned as usual.
"""

from __future__ import annotations

import logging

import aio_pika
from aio_pika.abc import AbstractExchange, AbstractIncomingMessage

from service.adapters import amqp
from service.adapters.amqp import messages
from service.core.errors import PublishNotConfirmed
from service.core.inputs import delivery_count, headers_of, message_id_of
from service.core.topology import DEAD_DELIVERY_LIMIT

log = logging.getLogger(__name__)

REFRESH_AT = DEAD_DELIVERY_LIMIT // 2
# Headers the broker keeps for itself; a fresh copy starts without them.
BROKER_COUNTS = frozenset({"x-delivery-count", "x-acquired-count"})


def fresh_copy(message: AbstractIncomingMessage) -> aio_pika.Message:
    """The same dead letter as a new message: headers kept but the broker's counts."""
    headers = {
        key: value for key, value in headers_of(message.headers).items() if key not in BROKER_COUNTS
    }
    return messages.copy_of(message, headers)


async def give_back(
    message: AbstractIncomingMessage,
    *,
    dead_exchange: AbstractExchange,
    queue: str,
    timeout: float,
) -> None:
    """Return a message taken from the dead-letter queue ``queue``, never past its limit."""
    key = message_id_of(message.message_id, message.body)
    count = delivery_count(headers_of(message.headers), redelivered=bool(message.redelivered))
    if count >= REFRESH_AT:
        try:
            await amqp.publish_confirmed(dead_exchange, fresh_copy(message), queue, timeout=timeout)
        except PublishNotConfirmed as exc:
            log.warning(
                "deadletter.refresh_failed",
                extra={"message_id": key, "queue": queue, "error": str(exc)},
            )
        else:
            log.info(
                "deadletter.refreshed", extra={"message_id": key, "queue": queue, "count": count}
            )
            await amqp.settle(message.ack, key)
            return
    await amqp.settle(lambda: message.reject(requeue=True), key)
