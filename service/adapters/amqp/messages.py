"""The one factory of the messages the service publishes.

An expiration command (the scan's, and a replay's, which is the same command
again) and a copy of a delivery (a retry, a dead letter, a refreshed dead
letter): persistent, their message id kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any
from uuid import UUID

import aio_pika
from aio_pika.abc import DeliveryMode

from service.adapters.amqp.consuming import AmqpMessage
from service.core.domain import command_body, message_id

APP_ID = "expiry-service"
COMMAND_TYPE = "expire"
CONTENT_TYPE = "application/json"


def command_for(reservation_id: UUID, hold_until: datetime) -> aio_pika.Message:
    """The persistent expiration command for one hold, with its stable message id."""
    return command(command_body(reservation_id, hold_until), message_id(reservation_id, hold_until))


def command(
    body: bytes, message_id_: str, *, headers: Mapping[str, Any] | None = None
) -> aio_pika.Message:
    """An expiration command with this body and message id (a replay sends the
    dead letter's own)."""
    return aio_pika.Message(
        body,
        content_type=CONTENT_TYPE,
        delivery_mode=DeliveryMode.PERSISTENT,
        message_id=message_id_,
        type=COMMAND_TYPE,
        app_id=APP_ID,
        headers=dict(headers) if headers else None,
    )


def copy_of(message: AmqpMessage, headers: Mapping[str, Any]) -> aio_pika.Message:
    """A delivery published again as a new message: the same body and properties, these
    headers (a fresh message never carries the broker's ``x-death`` or counts unless
    ``headers`` does), persistent; no expiration, user id or priority to trip on."""
    return aio_pika.Message(
        message.body,
        headers=dict(headers),
        content_type=message.content_type,
        content_encoding=message.content_encoding,
        delivery_mode=DeliveryMode.PERSISTENT,
        correlation_id=message.correlation_id,
        message_id=message.message_id,
        timestamp=message.timestamp,
        type=message.type,
        app_id=message.app_id,
    )
