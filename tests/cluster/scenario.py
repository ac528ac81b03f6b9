"""The cluster scenario's steps: declare, load, take the leader's node away, watch the rest.

``AMQP_URL`` names all three nodes, the work queue's leader first, so that
every consumer and the scanner start on the node that goes away. The publish
lease stays at its default (300 s), longer than the scenario may run: a lost
command would leave its hold ``held`` and fail the check rather than be
republished by a later scan.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from service.core.topology import build_topology
from tests.cluster.fleet import Fleet, ServiceProcess, event_time
from tests.cluster.nodes import ClusterNode, RabbitCluster
from tests.cluster.observe import (
    DEAD_QUEUE,
    QUEUE,
    EndState,
    connection_nodes,
    eventually,
    expired_count,
    insert_spread_holds,
    leader,
    queue_view,
    queue_views,
)
from tests.cluster.report import Figures
from tests.faults.services import RETRY_DELAYS, RETRY_JITTER, RETRY_JITTER_SLOTS
from tests.faults.services import service_env as faults_service_env
from tests.rabbitnode import management_url_beside

Departure = Literal["stop_app", "kill", "partition"]

CONSUMERS = 3
FAILOVER_SECONDS = 90.0
PARTITION_SECONDS = 10.0  # how long the partition lasts once the consumers have moved
STOP_AT = 1 / 3
SETTLE_SECONDS = 120.0  # after the last hold fell due, for the rest to expire
CONSUMER_PREFIX = "expiry-consume cluster-consumer"
SERVICE_QUEUES = {
    QUEUE,
    DEAD_QUEUE,
    "expirations.dead.log",
    *(
        spec.name
        for spec in build_topology(
            RETRY_DELAYS, jitter=RETRY_JITTER, slots=RETRY_JITTER_SLOTS
        ).delay_queues
    ),
}
PUBLISHED = re.compile(r"^scan: published (\d+) command", re.M)


def setting(name: str, default: float) -> float:
    """A positive number from the environment, or ``default``."""
    value = float(os.environ.get(name, default))
    assert value > 0, f"{name} must be > 0"
    return value


def service_env(amqp_url: str, database_url: str, worker: str) -> dict[str, str]:
    """The environment of one service process (nothing of the shell's EXPIRY_* leaks in)."""
    management_url = management_url_beside(amqp_url)
    return faults_service_env(database_url, amqp_url, management_url, EXPIRY_WORKER_ID=worker)


@dataclass
class Run:
    """One run of the scenario: the cluster and its vhost, the database, the processes."""

    cluster: RabbitCluster
    vhost: str
    database_url: str
    fleet: Fleet
    holds: int
    spread: float
    departure: Departure
    order: tuple[ClusterNode, ...] = ()

    @property
    def amqp_url(self) -> str:
        """``AMQP_URL``: every node, the work queue's leader first."""
        return ",".join(node.amqp_url(self.vhost) for node in self.order)

    @property
    def leader(self) -> ClusterNode:
        """The node that leads the work queue at the start (and goes away)."""
        return self.order[0]

    @property
    def survivor(self) -> ClusterNode:
        """A node that stays up: its management API is asked after the departure."""
        return self.order[1]

    def env(self, worker: str) -> dict[str, str]:
        """A service process's environment."""
        return service_env(self.amqp_url, self.database_url, worker)

    @property
    def consumers(self) -> list[ServiceProcess]:
        """The consumer processes."""
        return self.fleet.of("service.consume")

    @property
    def scanner(self) -> ServiceProcess:
        """The ``produce --every`` process."""
        [scanner] = [p for p in self.fleet.processes if p.name == "scanner"]
        return scanner

    @property
    def long_running(self) -> list[ServiceProcess]:
        """The consumers and the scanner (not the declaring scan)."""
        return [p for p in self.fleet.processes if p.name != "declare"]


async def declare_and_order(run: Run) -> None:
    """Declare the topology (``python -m service.declare``, the deploy's step); check the
    replicas; put the leader first."""
    first = run.cluster.nodes[0]
    env = service_env(run.cluster.amqp_url(run.vhost), run.database_url, "cluster-declare")
    declare = await run.fleet.run("service.declare", name="declare", env=env)
    assert declare.process.returncode == 0, declare.text()
    names = sorted(node.name for node in run.cluster.nodes)
    views = await queue_views(first, run.vhost)
    assert {view["name"] for view in views} == SERVICE_QUEUES
    for view in views:
        assert view["type"] == "quorum", view["name"]
        assert view["arguments"]["x-quorum-initial-group-size"] == 3, view["name"]
        assert sorted(view["members"]) == names, f"{view['name']}: {view['members']}"
    work_leader = run.cluster.node(leader(await queue_view(first, run.vhost, QUEUE)))
    run.order = (work_leader, *(node for node in run.cluster.nodes if node is not work_leader))


async def consumers_on(run: Run, node: ClusterNode, *, avoid: str | None = None) -> bool:
    """Whether the work queue counts exactly the consumers, every consumer connection is
    on a node other than ``avoid``, and ``avoid`` no longer leads the queue."""
    view = await queue_view(node, run.vhost, QUEUE)
    if view.get("consumers") != CONSUMERS or (avoid is not None and leader(view) == avoid):
        return False
    where = await connection_nodes(node, run.vhost, CONSUMER_PREFIX)
    return len(where) == CONSUMERS and avoid not in where.values()


async def start_consumers(run: Run) -> None:
    """Start the consumers and wait until all of them consume from the leader's node."""
    for number in range(1, CONSUMERS + 1):
        worker = f"cluster-consumer{number}"
        await run.fleet.start("service.consume", name=worker, env=run.env(worker))
    await eventually(lambda: consumers_on(run, run.leader), timeout=90)
    where = await connection_nodes(run.leader, run.vhost, CONSUMER_PREFIX)
    assert set(where.values()) == {run.leader.name}, where


def assert_running(run: Run) -> None:
    """Fail at once if a consumer or the scanner has exited."""
    exited = {p.name: p.process.returncode for p in run.long_running if not p.alive}
    assert not exited, f"exited during the run: {exited}"


async def succeeds(check: Callable[[], Awaitable[bool]], timeout: float) -> bool:
    """Whether ``check()`` comes true within ``timeout`` seconds."""
    try:
        await eventually(check, timeout=timeout, every=0.5)
    except TimeoutError:
        return False
    return True


async def wait_for_expired(run: Run, count: int, timeout: float) -> bool:
    """Wait until ``count`` holds are expired (False if not within ``timeout``); fail at
    once if a process died."""

    async def reached() -> bool:
        assert_running(run)
        return await expired_count(run.database_url) >= count

    return await succeeds(reached, timeout)


async def drained(run: Run, node: ClusterNode) -> bool:
    """Whether every queue but ``expirations.dead`` is empty (ready and unacked)."""
    views = await queue_views(node, run.vhost)
    busy = {
        view["name"]: (view.get("messages_ready"), view.get("messages_unacknowledged"))
        for view in views
        if view["name"] != DEAD_QUEUE
    }
    return bool(busy) and all(counts == (0, 0) for counts in busy.values())


@dataclass
class Departed:
    """The moment the leader's node went away, and what each process had written by then."""

    wall: datetime
    mono: float
    expired: int
    offsets: dict[str, int]
    took_s: float = 0.0
    healed_after_s: float = 0.0  # a partition: from the heal to the node's rejoining


def take_away(node: ClusterNode, departure: Departure, peers: list[ClusterNode]) -> float:
    """``rabbitmqctl stop_app`` (connections closed by the broker), SIGKILL (no goodbye), or
    a partition between the node and its peers (a minority of one, which pauses under
    ``pause_minority`` and closes its clients' connections); return how long that took."""
    began = time.monotonic()
    if departure == "stop_app":
        node.stop_app()
    elif departure == "kill":
        node.kill()
    else:
        node.isolate(peers)
    return time.monotonic() - began


async def heal(run: Run) -> float:
    """End a partition and wait until the paused node runs in the cluster again; return
    how long it took to rejoin."""
    began = time.monotonic()
    peers = [node for node in run.cluster.nodes if node is not run.leader]
    await asyncio.to_thread(run.leader.heal, peers)

    async def rejoined() -> bool:
        return await asyncio.to_thread(run.cluster.running_nodes) == sorted(
            node.name for node in run.cluster.nodes
        )

    assert await succeeds(rejoined, FAILOVER_SECONDS), "the paused node did not rejoin"
    return time.monotonic() - began


async def depart(run: Run) -> tuple[Departed, float]:
    """Take the leader's node away; return when, and how long until the consumers were back
    on the other nodes (measured while the node is still stopping)."""
    departed = Departed(
        wall=datetime.now(UTC),
        mono=time.monotonic(),
        expired=await expired_count(run.database_url),
        offsets={p.name: p.size() for p in run.fleet.processes},
    )
    peers = [node for node in run.cluster.nodes if node is not run.leader]
    stopping = asyncio.create_task(asyncio.to_thread(take_away, run.leader, run.departure, peers))
    try:
        back = await succeeds(lambda: consumers_back(run, departed), FAILOVER_SECONDS)
        back_s = time.monotonic() - departed.mono
    finally:
        departed.took_s = await stopping
    assert back, f"the consumers were not back within {FAILOVER_SECONDS:g}s: {await debug(run)}"
    moved = await succeeds(
        lambda: consumers_on(run, run.survivor, avoid=run.leader.name), FAILOVER_SECONDS
    )
    assert moved, f"the consumers' connections did not move: {await debug(run)}"
    return departed, back_s


async def consumers_back(run: Run, departed: Departed) -> bool:
    """Whether every consumer has left the node (its ``broker.next_node`` line) and the work
    queue lists exactly the consumers again, each on a channel of another node."""
    assert_running(run)
    for consumer in run.consumers:
        if not consumer.named("broker.next_node", departed.offsets[consumer.name]):
            return False
    view = await queue_view(run.survivor, run.vhost, QUEUE)
    nodes = [channel_node(detail) for detail in view.get("consumer_details") or []]
    return len(nodes) == CONSUMERS and all(n not in (None, run.leader.name) for n in nodes)


def channel_node(consumer_detail: dict[str, Any]) -> str | None:
    """The node of a consumer's channel, as the management API lists it."""
    channel = consumer_detail.get("channel_details")
    return str(channel["node"]) if isinstance(channel, dict) and "node" in channel else None


async def debug(run: Run) -> dict[str, Any]:
    """What the survivor says about the work queue and the consumers' connections."""
    view: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        view = await queue_view(run.survivor, run.vhost, QUEUE)
    with contextlib.suppress(Exception):
        view["connections"] = await connection_nodes(run.survivor, run.vhost, CONSUMER_PREFIX)
    keys = ("consumers", "leader", "online", "members", "consumer_details", "connections")
    return {key: view.get(key) for key in keys}


@dataclass
class Observation:
    """What the scenario saw, beside the processes' logs."""

    departed: Departed
    consumers_back_s: float
    consumer_nodes: dict[str, str]
    all_expired: bool
    queues_drained: bool
    total_s: float
    exit_codes: dict[str, int]
    dead_queue: int
    departed_before_last_due: bool


async def scenario(run: Run) -> Observation:
    """Declare, load, take the leader away at a third, wait for the end, SIGTERM everything."""
    await declare_and_order(run)
    await start_consumers(run)
    await run.fleet.start(
        "service.produce", "--every", "1", name="scanner", env=run.env("cluster-scanner")
    )
    # Holds fall due while everything runs: the scanner publishes what fell due each
    # second, so that the departure finds it publishing and the consumers busy.
    started = time.monotonic()
    await insert_spread_holds(run.database_url, run.holds, run.spread)
    last_due = time.monotonic() + run.spread
    reached = await wait_for_expired(run, int(run.holds * STOP_AT), run.spread + SETTLE_SECONDS)
    assert reached, "a third of the holds did not expire before the departure"
    departed, back_s = await depart(run)
    consumer_nodes = await connection_nodes(run.survivor, run.vhost, CONSUMER_PREFIX)
    if run.departure == "partition":
        paused = run.leader.name not in await asyncio.to_thread(run.cluster.running_nodes)
        assert paused, "the minority node did not pause"
        await asyncio.sleep(PARTITION_SECONDS)
        departed.healed_after_s = await heal(run)
    remaining = max(0.0, last_due - time.monotonic()) + SETTLE_SECONDS
    all_expired = await wait_for_expired(run, run.holds, remaining)
    queues_drained = await succeeds(lambda: drained(run, run.survivor), 60)
    total_s = time.monotonic() - started
    dead_queue = int((await queue_view(run.survivor, run.vhost, DEAD_QUEUE)).get("messages") or 0)
    exit_codes = {p.name: await p.stop() for p in run.long_running}
    return Observation(
        departed=departed,
        consumers_back_s=back_s,
        consumer_nodes=consumer_nodes,
        all_expired=all_expired,
        queues_drained=queues_drained,
        total_s=total_s,
        exit_codes=exit_codes,
        dead_queue=dead_queue,
        departed_before_last_due=departed.mono < last_due,
    )


def _seconds_after(start: datetime, stamps: list[datetime], last: bool = False) -> float:
    if not stamps:
        return float("nan")
    return ((max if last else min)(stamps) - start).total_seconds()


def _first_outcome_after_last_move(events: list[dict[str, Any]]) -> datetime | None:
    moves = [t for e in events if e.get("event") == "broker.next_node" and (t := event_time(e))]
    if not moves:
        return None
    last_move = max(moves)
    for event in events:
        stamp = event_time(event)
        if event.get("event") == "expiry.outcome" and stamp is not None and stamp > last_move:
            return stamp
    return None


def resumptions(run: Run, departed: Departed) -> list[datetime]:
    """When each consumer that moved logged its first outcome after its last move."""
    firsts = [
        _first_outcome_after_last_move(consumer.events(departed.offsets[consumer.name]))
        for consumer in run.consumers
    ]
    return [stamp for stamp in firsts if stamp is not None]


def connections_lost(run: Run, departed: Departed) -> float:
    """The departure -> the first consumer's ``broker.next_node`` line."""
    stamps = [
        t
        for consumer in run.consumers
        for e in consumer.named("broker.next_node", departed.offsets[consumer.name])
        if (t := event_time(e)) is not None
    ]
    return _seconds_after(departed.wall, stamps)


def scans_after(run: Run, departed: Departed) -> list[int]:
    """What each scan that reported after the departure published."""
    scanner = run.scanner
    return [int(n) for n in PUBLISHED.findall(scanner.text(departed.offsets[scanner.name]))]


def figures_of(run: Run, seen: Observation, state: EndState) -> Figures:
    """The figures of this run, from the logs, the database and the queues."""
    departed = seen.departed
    outcomes = run.fleet.outcomes()
    after = scans_after(run, departed)
    scanner = run.scanner
    resumed = resumptions(run, departed)
    return Figures(
        departure=run.departure,
        holds=run.holds,
        node_gone=run.leader.name,
        expired_at_departure=departed.expired,
        departure_took_s=round(departed.took_s, 1),
        connections_lost_s=round(connections_lost(run, departed), 1),
        consumers_back_s=round(seen.consumers_back_s, 1),
        work_resumed_s=round(_seconds_after(departed.wall, resumed), 1),
        all_consumers_working_s=round(_seconds_after(departed.wall, resumed, last=True), 1),
        total_s=round(seen.total_s, 1),
        deliveries=sum(outcomes.values()),
        duplicates=outcomes["already-done"],
        expired_without_outcome=state.statuses.get("expired", 0)
        - len(run.fleet.reservations_with("expired")),
        redelivered=sum(
            1 for c in run.consumers for e in c.named("expiry.outcome") if e.get("redelivered")
        ),
        retries=run.fleet.count("expiry.retry"),
        dead_letters=seen.dead_queue + state.dead_letter_records,
        next_node_lines=run.fleet.count("broker.next_node"),
        stale_acks=run.fleet.count("expiry.stale_delivery")
        + run.fleet.count("expiry.settle_failed"),
        republished=state.republished,
        scans_after_departure=len(after),
        published_after_departure=sum(after),
        scanner_unreachable=len(scanner.named("broker.unreachable", departed.offsets["scanner"])),
        failed_scans=len(scanner.named("scan.failed")),
        consumers_now_on=", ".join(sorted(set(seen.consumer_nodes.values()))),
        rejoined_after_heal_s=round(departed.healed_after_s, 1),
    )
