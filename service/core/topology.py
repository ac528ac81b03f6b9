"""Exchange and queue names and arguments, as data: pure, no I/O.

::

    produce ──► [expirations] ──expire──► (expirations) ──► consume
                     ▲                          │ delivery limit
                     │ TTL expiry               ▼
    consume ──► [expirations.retry] ──<slot>──► (expirations.retry.<slot>)
    consume ──► [expirations.dead]  ──dead──► (expirations.dead)      kept for replay
                                      └─dead──► (expirations.dead.log)  -> records
    relay   ──► [expiry.events] ──reservation.expired──► (each reader's own queue)

Every queue is a quorum queue. A delay queue has a fixed TTL and dead-letters
back to ``expirations`` when it runs out, so delays live in the broker; each
queue holds one delay only, so that no message waits behind a longer one.

With jitter, each backoff tier (its bound, ``d`` seconds) has several "slot"
queues whose delays are spread evenly over ``[d * (1 - jitter), d]``, and a
retry picks one at random: commands that failed together come back spread over
the window, never later than the bound. Per-message TTLs in one queue would not
do: the broker expires messages only at the head of a queue, so a burst leaves
at the running maximum of its TTLs. A queue is named for its delay, in whole
seconds when it is one (``30s``, the top slot of a tier), else in milliseconds
(``17143ms``); two tiers that share a slot delay share its queue.

Declaring it (``python -m service.declare``, the deploy's step) and checking
it (what the running processes do) live in ``service.adapters.amqp.declaring``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

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
# What other services learn (../shared/CONTRACT.md, "Events"): the relay publishes one
# event per expiry here; each reader binds a queue of its own.
EVENTS_EXCHANGE = "expiry.events"
EVENT_ROUTING_KEY = "reservation.expired"

# The last guard against a message that kills every consumer that takes it:
# after this many deliveries the broker dead-letters it to expirations.dead.
# Set explicitly: RabbitMQ 4.x would otherwise apply a default of 20.
DELIVERY_LIMIT = 10
# The dead-letter queues are read only by operators and the recorder; they must
# never drop a message, so their limit is set far above normal use, and a dead
# letter returned half as often is replaced by a fresh copy (adapters/amqp/returns.py).
DEAD_DELIVERY_LIMIT = 1000

DECLARE_COMMAND = "python -m service.declare"

# Each quorum queue starts with this many replicas (capped at the cluster's
# size), so on a three-node cluster every queue survives the loss of a node.
# Set explicitly: RabbitMQ versions differ in their default.
QUORUM_INITIAL_GROUP_SIZE = 3

ArgValue = str | int
DIRECT = "direct"
TOPIC = "topic"


def slot_delays_ms(delay_seconds: int, jitter: float, slots: int) -> tuple[int, ...]:
    """The delays (whole milliseconds, ascending, distinct) of one tier's slot queues.

    ``slots`` delays spread evenly over ``[delay * (1 - jitter), delay]``, both ends
    included and never above the tier's own delay; one slot, the delay itself, when
    ``jitter`` is 0 (or too small to span a millisecond).
    """
    bound_ms = delay_seconds * 1000
    # The window is cut to whole milliseconds inside [bound * (1 - jitter), bound];
    # rounding to six places first keeps 0.3 * 1000 from counting as 300.00000000000006.
    window_ms = math.floor(round(bound_ms * jitter, 6)) if jitter > 0 else 0
    if window_ms == 0 or slots < 2:
        return (bound_ms,)
    low_ms = bound_ms - window_ms
    return tuple(sorted({low_ms + window_ms * i // (slots - 1) for i in range(slots)}))


def retry_delays_ms(retry_delays: Iterable[int], jitter: float, slots: int) -> tuple[int, ...]:
    """The delay of every delay queue (milliseconds, ascending, distinct) for these tiers."""
    return tuple(sorted({ms for d in retry_delays for ms in slot_delays_ms(d, jitter, slots)}))


def delay_label(delay_ms: int) -> str:
    """A delay as it names its queue: whole seconds when it is one (``30s``), else ``17143ms``."""
    seconds, rest = divmod(delay_ms, 1000)
    return f"{seconds}s" if rest == 0 else f"{delay_ms}ms"


def delay_queue(delay_ms: int) -> str:
    """The delay queue of ``delay_ms``, e.g. ``expirations.retry.30s``."""
    return f"{RETRY_EXCHANGE}.{delay_label(delay_ms)}"


def delay_routing_key(delay_ms: int) -> str:
    """The routing key that selects the delay queue of ``delay_ms`` on the retry exchange."""
    return delay_label(delay_ms)


@dataclass(frozen=True)
class ExchangeSpec:
    """A durable exchange."""

    name: str
    type: str = DIRECT


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

    @property
    def delay_queues(self) -> tuple[QueueSpec, ...]:
        """The delay queues: every queue of the retry exchange."""
        return tuple(q for q in self.queues if q.exchange == RETRY_EXCHANGE)


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


def build_topology(retry_delays: tuple[int, ...], *, jitter: float, slots: int) -> Topology:
    """The full topology for these backoff tiers (seconds), each with ``slots`` delay
    queues spread over its ``jitter`` window (one when ``jitter`` is 0)."""
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
            delay_queue(delay_ms),
            RETRY_EXCHANGE,
            delay_routing_key(delay_ms),
            _quorum(**{"x-message-ttl": delay_ms}, **_dead_letters_to(EXCHANGE, ROUTING_KEY)),
        )
        for delay_ms in retry_delays_ms(retry_delays, jitter, slots)
    )
    # Each dead-letter queue is also routed by its own name, so that a dead letter
    # returned too often can be replaced by a fresh copy in that queue alone
    # (service/adapters/amqp/returns.py).
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
            *events_topology().exchanges,
        ),
        queues=(work, *delays, dead, dead_log),
    )


def events_topology() -> Topology:
    """The part of the topology the relay publishes to, and checks at its start: the
    events exchange (each reader binds a queue of its own; none is the service's)."""
    return Topology(exchanges=(ExchangeSpec(EVENTS_EXCHANGE, TOPIC),), queues=())


def definitions(topology: Topology, vhost: str = "/") -> dict[str, list[dict[str, Any]]]:
    """The topology as RabbitMQ definitions (the format ``rabbitmq/`` ships)."""
    return {
        "exchanges": [
            {
                "name": ex.name,
                "vhost": vhost,
                "type": ex.type,
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
