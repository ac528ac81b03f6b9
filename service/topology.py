"""Exchange and queue names and arguments (pure), their declaration, and the check
that they exist.

::

    produce ──► [expirations] ──expire──► (expirations) ──► consume
                     ▲                          │ delivery limit
                     │ TTL expiry               ▼
    consume ──► [expirations.retry] ──Ns──► (expirations.retry.Ns)
    consume ──► [expirations.dead]  ──dead──► (expirations.dead)      kept for replay
                                      └─dead──► (expirations.dead.log)  -> records

Every queue is a quorum queue. A delay queue has a fixed TTL and dead-letters
back to ``expirations`` when it runs out, so delays live in the broker, one
queue per tier so that no message waits behind a longer one.

Declaring needs the configure permission; only ``python -m service.declare``
(the deploy's step) does it. The running processes check instead
(``require_topology``: passive declares, which need no permission, and
``service.declare.check_topology`` for the arguments).
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiormq.exceptions
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractExchange,
    AbstractQueue,
    ExchangeType,
)

from service.errors import TopologyMismatch

EXCHANGE = "expirations"
QUEUE = "expirations"
ROUTING_KEY = "expire"
RETRY_EXCHANGE = "expirations.retry"
DEAD_EXCHANGE = "expirations.dead"
DEAD_QUEUE = "expirations.dead"
DEAD_ROUTING_KEY = "dead"
# A second copy of every dead letter, read by the consumers' recorder, which
# writes the operator's dead-letter record; expirations.dead itself is left
# alone for inspection and replay.
DEAD_LOG_QUEUE = "expirations.dead.log"

# The last guard against a message that kills every consumer that takes it:
# after this many deliveries the broker dead-letters it to expirations.dead.
# Set explicitly: RabbitMQ 4.x would otherwise apply a default of 20.
DELIVERY_LIMIT = 10
# The dead-letter queues are read only by operators and the recorder; they must
# never drop a message, so their limit is set far above normal use, and a dead
# letter returned half as often is replaced by a fresh copy (service/returns.py).
DEAD_DELIVERY_LIMIT = 1000

DECLARE_COMMAND = "python -m service.declare"

# Each quorum queue starts with this many replicas (capped at the cluster's
# size), so on a three-node cluster every queue survives the loss of a node.
# Set explicitly: RabbitMQ versions differ in their default.
QUORUM_INITIAL_GROUP_SIZE = 3

ArgValue = str | int
T = TypeVar("T")


def retry_queue(delay_seconds: int) -> str:
    """The delay queue of one backoff tier, e.g. ``expirations.retry.30s``."""
    return f"{RETRY_EXCHANGE}.{delay_seconds}s"


def retry_routing_key(delay_seconds: int) -> str:
    """The routing key that selects one tier on the retry exchange."""
    return f"{delay_seconds}s"


@dataclass(frozen=True)
class ExchangeSpec:
    """A durable exchange."""

    name: str
    type: ExchangeType = ExchangeType.DIRECT


@dataclass(frozen=True)
class QueueSpec:
    """A durable queue, bound to ``exchange`` with ``routing_key`` (and ``also_routed_by``)."""

    name: str
    exchange: str
    routing_key: str
    arguments: dict[str, ArgValue] = field(default_factory=dict)
    also_routed_by: tuple[str, ...] = ()

    @property
    def routing_keys(self) -> tuple[str, ...]:
        """Every routing key that binds this queue to its exchange."""
        return (self.routing_key, *self.also_routed_by)


@dataclass(frozen=True)
class Topology:
    """Everything the service declares."""

    exchanges: tuple[ExchangeSpec, ...]
    queues: tuple[QueueSpec, ...]


def _quorum(**extra: ArgValue) -> dict[str, ArgValue]:
    return {
        "x-queue-type": "quorum",
        "x-quorum-initial-group-size": QUORUM_INITIAL_GROUP_SIZE,
        **extra,
    }


def _dead_letters_to(exchange: str, routing_key: str) -> dict[str, ArgValue]:
    # At-least-once dead-lettering: the source keeps a message until the target
    # queue confirmed it. It requires reject-publish overflow.
    return {
        "x-dead-letter-exchange": exchange,
        "x-dead-letter-routing-key": routing_key,
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }


def build_topology(retry_delays: tuple[int, ...]) -> Topology:
    """The full topology for these backoff tiers (seconds)."""
    work = QueueSpec(
        QUEUE,
        EXCHANGE,
        ROUTING_KEY,
        _quorum(
            **{"x-delivery-limit": DELIVERY_LIMIT},
            **_dead_letters_to(DEAD_EXCHANGE, DEAD_ROUTING_KEY),
        ),
    )
    delays = tuple(
        QueueSpec(
            retry_queue(delay),
            RETRY_EXCHANGE,
            retry_routing_key(delay),
            _quorum(**{"x-message-ttl": delay * 1000}, **_dead_letters_to(EXCHANGE, ROUTING_KEY)),
        )
        for delay in retry_delays
    )
    # Each dead-letter queue is also routed by its own name, so that a dead letter
    # returned too often can be replaced by a fresh copy in that queue alone
    # (service/returns.py).
    dead = QueueSpec(
        DEAD_QUEUE,
        DEAD_EXCHANGE,
        DEAD_ROUTING_KEY,
        _quorum(**{"x-delivery-limit": DEAD_DELIVERY_LIMIT}),
        also_routed_by=(DEAD_QUEUE,),
    )
    dead_log = QueueSpec(
        DEAD_LOG_QUEUE,
        DEAD_EXCHANGE,
        DEAD_ROUTING_KEY,
        _quorum(**{"x-delivery-limit": DEAD_DELIVERY_LIMIT}),
        also_routed_by=(DEAD_LOG_QUEUE,),
    )
    return Topology(
        exchanges=(
            ExchangeSpec(EXCHANGE),
            ExchangeSpec(RETRY_EXCHANGE),
            ExchangeSpec(DEAD_EXCHANGE),
        ),
        queues=(work, *delays, dead, dead_log),
    )


def definitions(topology: Topology, vhost: str = "/") -> dict[str, list[dict[str, Any]]]:
    """The topology as RabbitMQ definitions (the format ``rabbitmq/`` ships)."""
    return {
        "exchanges": [
            {
                "name": ex.name,
                "vhost": vhost,
                "type": str(ex.type.value),
                "durable": True,
                "auto_delete": False,
                "internal": False,
                "arguments": {},
            }
            for ex in topology.exchanges
        ],
        "queues": [
            {
                "name": q.name,
                "vhost": vhost,
                "durable": True,
                "auto_delete": False,
                "arguments": dict(q.arguments),
            }
            for q in topology.queues
        ],
        "bindings": [
            {
                "source": q.exchange,
                "vhost": vhost,
                "destination": q.name,
                "destination_type": "queue",
                "routing_key": key,
                "arguments": {},
            }
            for q in topology.queues
            for key in q.routing_keys
        ],
    }


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
            f"exchange {ex.name!r}", channel.declare_exchange(ex.name, ex.type, durable=True)
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
