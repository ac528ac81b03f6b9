"""Unit tests for service.core.topology: names, arguments, and rabbitmq/ in step."""

from __future__ import annotations

import json
from pathlib import Path

from service.core import topology
from service.settings import Settings

DEFINITIONS = Path(__file__).resolve().parents[2] / "rabbitmq" / "definitions.json"


def test_every_queue_is_a_durable_quorum_queue() -> None:
    """Quorum queues everywhere: replicated, and with at-least-once dead-lettering."""
    for queue in topology.build_topology((1, 5)).queues:
        assert queue.arguments["x-queue-type"] == "quorum"


def test_work_queue_has_an_explicit_delivery_limit_and_dead_letter_target() -> None:
    """The delivery limit is set (not the broker's default) and dead-letters at least once."""
    work = topology.build_topology((1,)).queues[0]
    assert work.name == "expirations"
    assert work.arguments["x-delivery-limit"] == topology.DELIVERY_LIMIT
    assert work.arguments["x-dead-letter-exchange"] == "expirations.dead"
    assert work.arguments["x-dead-letter-strategy"] == "at-least-once"
    assert work.arguments["x-overflow"] == "reject-publish"


def test_one_delay_queue_per_tier_with_a_fixed_ttl_back_to_work() -> None:
    """Each tier is its own queue, so no message waits behind a longer delay."""
    delays = {q.name: q for q in topology.build_topology((1, 5, 30)).queues}
    for seconds in (1, 5, 30):
        queue = delays[topology.retry_queue(seconds)]
        assert queue.arguments["x-message-ttl"] == seconds * 1000
        assert queue.arguments["x-dead-letter-exchange"] == "expirations"
        assert queue.arguments["x-dead-letter-routing-key"] == "expire"
        assert queue.routing_key == topology.retry_routing_key(seconds)
        assert queue.name.startswith("expirations.retry")


def test_shipped_definitions_match_the_declared_topology() -> None:
    """rabbitmq/definitions.json holds exactly what the service declares by default."""
    shipped = json.loads(DEFINITIONS.read_text())
    declared = topology.definitions(topology.build_topology(Settings().retry_delays))

    def key(kind: str, item: dict[str, object]) -> str:
        if kind == "bindings":
            return f"{item['source']}->{item['destination']}:{item['routing_key']}"
        return str(item["name"])

    for kind in ("exchanges", "queues", "bindings"):
        ours = {key(kind, item): item for item in declared[kind]}
        theirs = {key(kind, item): item for item in shipped[kind] if item["vhost"] == "/"}
        assert theirs == ours, kind
