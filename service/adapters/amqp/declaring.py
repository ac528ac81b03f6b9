"""Declaring the topology (the deploy's step) and checking it (the running processes).

Declaring needs RabbitMQ's configure permission; only ``python -m
service.declare`` does it. The running processes check instead, changing
nothing: every exchange and queue must exist (passive declares, which need no
permission), and their arguments and bindings, read from the management API,
must be what ``build_topology`` says. When that API cannot be read, one
warning says so and the check stops at existence: a consumer does not depend
on the management plugin to run.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

import aiormq.exceptions
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractExchange,
    AbstractQueue,
    ExchangeType,
)

from service.adapters.amqp import management
from service.core.errors import TopologyMismatch
from service.core.redaction import redact
from service.core.tls_failures import refused
from service.core.topology import DECLARE_COMMAND, Topology, build_topology
from service.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")


def topology_for(settings: Settings) -> Topology:
    """The topology of these settings: their backoff tiers, jittered over their slots."""
    return build_topology(
        settings.retry_delays, jitter=settings.retry_jitter, slots=settings.retry_jitter_slots
    )


@dataclass(frozen=True)
class Declared:
    """The declared objects, by name, on the channel that declared them."""

    exchanges: dict[str, AbstractExchange]
    queues: dict[str, AbstractQueue]


async def declare_topology(channel: AbstractChannel, topology: Topology) -> Declared:
    """Declare everything idempotently; return what was declared.

    Raises ``TopologyMismatch`` (one line naming the object) when the broker
    already holds a queue or exchange of that name declared otherwise.
    """
    exchanges: dict[str, AbstractExchange] = {}
    queues: dict[str, AbstractQueue] = {}
    for ex in topology.exchanges:
        exchanges[ex.name] = await _declare(
            f"exchange {ex.name!r}",
            channel.declare_exchange(ex.name, ExchangeType(ex.type), durable=True),
        )
    for spec in topology.queues:
        queue = await _declare(
            f"queue {spec.name!r}",
            channel.declare_queue(spec.name, durable=True, arguments=dict(spec.arguments)),
        )
        for key in spec.routing_keys:
            await queue.bind(exchanges[spec.exchange], routing_key=key)
        queues[spec.name] = queue
    return Declared(exchanges, queues)


async def _declare(what: str, declaration: Awaitable[T]) -> T:
    try:
        result = await declaration
    except aiormq.exceptions.ChannelPreconditionFailed as exc:
        detail = str(exc.args[0]) if exc.args else str(exc)
        raise TopologyMismatch(
            f"{what} exists on the broker with other settings ({detail}); "
            "delete it or fix its policy, then start again"
        ) from None
    return result


async def require_topology(connection: AbstractConnection, topology: Topology) -> None:
    """Check, changing nothing, that every exchange and queue exists (passive declares).

    Raises ``TopologyMismatch`` (one line naming the first one missing).
    """
    channel = await connection.channel(publisher_confirms=False)
    try:
        for ex in topology.exchanges:
            await _exists(f"exchange {ex.name!r}", channel.declare_exchange(ex.name, passive=True))
        for spec in topology.queues:
            await _exists(f"queue {spec.name!r}", channel.declare_queue(spec.name, passive=True))
    finally:
        if not channel.is_closed:
            await channel.close()


async def _exists(what: str, declaration: Awaitable[T]) -> None:
    try:
        await declaration
    except aiormq.exceptions.ChannelNotFoundEntity:
        raise TopologyMismatch(
            f"{what} does not exist on the broker; declare the topology first: {DECLARE_COMMAND}"
        ) from None


async def check_topology(
    connection: AbstractConnection, settings: Settings, topology: Topology | None = None
) -> None:
    """Check the topology (by default all of it; the relay's part, ``events_topology()``,
    for the relay) without changing it; ``TopologyMismatch`` (one line) if it differs."""
    topology = topology or topology_for(settings)
    await require_topology(connection, topology)
    endpoint = management.endpoint_for(settings)
    try:
        observed = await management.read_observed(endpoint)
    except management.ManagementUnavailable as exc:
        if exc.tls_refused is not None:  # a setting's fault, not the API away for a while
            raise refused("EXPIRY_MANAGEMENT_URL", endpoint.base, exc.tls_refused) from None
        log.warning(
            "topology.arguments_unchecked",
            extra={"management_url": redact(endpoint.base), "reason": redact(str(exc))},
        )
        return
    found = management.drift(topology, observed)
    if found is not None:
        raise TopologyMismatch(
            f"{found.what} exists on the broker with other settings "
            f"({'; '.join(found.details)}); delete it and run {DECLARE_COMMAND}, then start again"
        )
    log.debug("topology.checked", extra={"queues": len(topology.queues)})
