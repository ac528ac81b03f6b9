"""Unit tests for service.core.topology: names, arguments, and rabbitmq/ in step."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from service.adapters.amqp.declaring import topology_for
from service.core import topology
from service.settings import Settings

DEFINITIONS = Path(__file__).resolve().parents[2] / "rabbitmq" / "definitions.json"


def test_every_queue_is_a_durable_quorum_queue() -> None:
    """Quorum queues everywhere: replicated, and with at-least-once dead-lettering."""
    for queue in topology.build_topology((1, 5), jitter=0.5, slots=4).queues:
        assert queue.arguments["x-queue-type"] == "quorum"


def test_work_queue_has_an_explicit_delivery_limit_and_dead_letter_target() -> None:
    """The delivery limit is set (not the broker's default) and dead-letters at least once."""
    work = topology.build_topology((1,), jitter=0.0, slots=2).queues[0]
    assert work.name == "expirations"
    assert work.arguments["x-delivery-limit"] == topology.DELIVERY_LIMIT
    assert work.arguments["x-dead-letter-exchange"] == "expirations.dead"
    assert work.arguments["x-dead-letter-strategy"] == "at-least-once"
    assert work.arguments["x-overflow"] == "reject-publish"


def test_without_jitter_one_delay_queue_per_tier_with_a_fixed_ttl_back_to_work() -> None:
    """Jitter 0: each tier is its one queue, named in seconds as before jitter existed."""
    built = topology.build_topology((1, 5, 30), jitter=0.0, slots=8)
    assert [q.name for q in built.delay_queues] == [
        "expirations.retry.1s",
        "expirations.retry.5s",
        "expirations.retry.30s",
    ]
    for queue, seconds in zip(built.delay_queues, (1, 5, 30), strict=True):
        assert queue.arguments["x-message-ttl"] == seconds * 1000
        assert queue.arguments["x-dead-letter-exchange"] == "expirations"
        assert queue.arguments["x-dead-letter-routing-key"] == "expire"
        assert (queue.exchange, queue.routing_key) == ("expirations.retry", f"{seconds}s")


@pytest.mark.parametrize("delay", [1, 2, 5, 7, 30, 120, 3600])
@pytest.mark.parametrize("jitter", [0.01, 0.1, 0.3, 0.5, 0.9, 0.999])
@pytest.mark.parametrize("slots", [2, 3, 8, 32])
def test_slot_delays_lie_in_the_jitter_window_and_end_at_the_bound(
    delay: int, jitter: float, slots: int
) -> None:
    """Every slot delay is whole milliseconds within [d * (1 - j), d]; the lowest is the
    window's start (to the millisecond), the highest the bound itself."""
    delays = topology.slot_delays_ms(delay, jitter, slots)
    bound = delay * 1000
    assert list(delays) == sorted(set(delays))
    assert all(isinstance(ms, int) for ms in delays)
    assert delays[-1] == bound
    assert bound * (1 - jitter) - 1e-6 <= delays[0] < bound * (1 - jitter) + 1
    assert all(bound * (1 - jitter) - 1e-6 <= ms <= bound for ms in delays)


def test_slot_delays_are_spread_evenly() -> None:
    """The gaps between slots differ by at most a millisecond (the rounding)."""
    delays = topology.slot_delays_ms(30, 0.5, 8)
    assert len(delays) == 8
    gaps = {b - a for a, b in itertools.pairwise(delays)}
    assert max(gaps) - min(gaps) <= 1
    assert delays == (15000, 17142, 19285, 21428, 23571, 25714, 27857, 30000)


def test_a_window_narrower_than_the_slots_keeps_distinct_slots_only() -> None:
    """Slots that would round to the same millisecond are one; jitter 0, or too small to
    span a millisecond, leaves the tier's bound alone."""
    assert topology.slot_delays_ms(1, 0.002, 8) == (998, 999, 1000)
    assert topology.slot_delays_ms(1, 0.0001, 8) == (1000,)
    assert topology.slot_delays_ms(5, 0.0, 8) == (5000,)


@pytest.mark.parametrize(
    ("delay_ms", "name", "key"),
    [
        (1000, "expirations.retry.1s", "1s"),
        (30000, "expirations.retry.30s", "30s"),
        (17142, "expirations.retry.17142ms", "17142ms"),
        (500, "expirations.retry.500ms", "500ms"),
        (1001, "expirations.retry.1001ms", "1001ms"),
    ],
)
def test_a_delay_queue_is_named_for_its_delay(delay_ms: int, name: str, key: str) -> None:
    """Whole seconds as ``Ns`` (today's names), anything else in milliseconds."""
    assert topology.delay_queue(delay_ms) == name
    assert topology.delay_routing_key(delay_ms) == key


def test_the_top_slot_of_every_tier_keeps_its_queue_and_binding() -> None:
    """With jitter the tiers' own queues are still there, so nothing of a deployment goes."""
    plain = topology.build_topology((1, 5, 30, 120), jitter=0.0, slots=8).delay_queues
    jittered = {
        q.name: q
        for q in topology.build_topology((1, 5, 30, 120), jitter=0.5, slots=8).delay_queues
    }
    for queue in plain:
        assert jittered[queue.name] == queue


def test_tiers_that_share_a_slot_delay_share_its_queue() -> None:
    """Tiers 1 s and 2 s with jitter 0.5 both have a 1 s slot: declared once."""
    built = topology.build_topology((1, 2), jitter=0.5, slots=3)
    names = [q.name for q in built.delay_queues]
    assert names == [
        "expirations.retry.500ms",
        "expirations.retry.750ms",
        "expirations.retry.1s",
        "expirations.retry.1500ms",
        "expirations.retry.2s",
    ]
    assert len({q.name for q in built.queues}) == len(built.queues)
    assert topology.retry_delays_ms((1, 2), 0.5, 3) == (500, 750, 1000, 1500, 2000)


def test_every_slot_queue_has_its_own_ttl_and_routing_key() -> None:
    """A slot queue's TTL is the delay its name says, and it is bound by that name's key."""
    for queue in topology.build_topology((1, 5, 30, 120), jitter=0.5, slots=8).delay_queues:
        label = queue.name.removeprefix("expirations.retry.")
        assert queue.routing_key == label
        ttl = queue.arguments["x-message-ttl"]
        assert isinstance(ttl, int)
        assert label == (f"{ttl // 1000}s" if ttl % 1000 == 0 else f"{ttl}ms")


def test_default_settings_give_eight_slots_per_tier() -> None:
    """The defaults: four tiers, eight slot queues each, none shared."""
    built = topology_for(Settings())
    assert len(built.delay_queues) == 32
    assert len(built.queues) == 32 + 3


def test_shipped_definitions_match_the_declared_topology() -> None:
    """rabbitmq/definitions.json holds exactly what the service declares by default."""
    shipped = json.loads(DEFINITIONS.read_text())
    declared = topology.definitions(topology_for(Settings()))

    def key(kind: str, item: dict[str, object]) -> str:
        if kind == "bindings":
            return f"{item['source']}->{item['destination']}:{item['routing_key']}"
        return str(item["name"])

    for kind in ("exchanges", "queues", "bindings"):
        ours = {key(kind, item): item for item in declared[kind]}
        theirs = {key(kind, item): item for item in shipped[kind] if item["vhost"] == "/"}
        assert theirs == ours, kind
