"""Issue 7: the service on a three-node RabbitMQ cluster; the node that leads the work queue
goes away mid-stream.

The real commands (``produce --every 1`` and three ``consume``) run against a
private cluster of the machine's ``rabbitmq-server`` (three nodes joined with
``rabbitmqctl join_cluster``, see ``nodes.py``), with ``AMQP_URL`` naming all
three nodes. Holds fall due over ``CLUSTER_SPREAD_SECONDS`` (12); once a third
of them are expired, the work queue's leader goes away, by ``rabbitmqctl
stop_app`` (the broker closes the connections) or by SIGKILL of the whole
node (no goodbye). ``CLUSTER_HOLDS`` (8000) sets the load; whatever it is, the check
fails unless the departure found holds not yet expired (it landed mid-stream).

A departure by partition cuts the leader's node off from the other two at
the distribution layer (``pause_minority`` pauses it) and heals it after.

Two smaller tests keep two fixed faults fixed: a batch that commits after its
connection was lost still logs its ``expired`` outcomes, and ``status`` reads
the queues through another node of ``AMQP_URL`` when the first is down.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.cluster.fleet import Fleet, ServiceProcess
from tests.cluster.nodes import ClusterNode, RabbitCluster
from tests.cluster.observe import (
    EndState,
    close_connections,
    consumers_waiting_on_locks,
    end_state,
    eventually,
    expired_count,
    insert_spread_holds,
    queue_view,
    reservations_locked,
)
from tests.cluster.report import report
from tests.cluster.scenario import (
    Departure,
    Observation,
    Run,
    figures_of,
    scans_after,
    scenario,
    service_env,
    setting,
)

pytestmark = [pytest.mark.faults, pytest.mark.cluster]

SCENARIO_SECONDS = 300.0  # one scenario, the cluster's boot aside
LOCKED_HOLDS = 20


class OutcomeNotLogged(AssertionError):
    """An expired hold whose ``expired`` outcome no consumer logged."""


async def test_a_batch_that_commits_after_its_connection_was_lost_logs_its_outcomes(
    rabbit_cluster: RabbitCluster, cluster_vhost: str, cluster_database: str, tmp_path: Path
) -> None:
    """A batch waiting on a lock when the consumer's connection is closed commits later;
    every hold it expired still gets its one ``expired`` outcome line."""
    node = rabbit_cluster.nodes[0]
    env = service_env(rabbit_cluster.amqp_url(cluster_vhost), cluster_database, "lockstep")
    fleet = Fleet(tmp_path)
    ids = await insert_spread_holds(cluster_database, LOCKED_HOLDS, 0.0)
    try:
        async with asyncio.timeout(SCENARIO_SECONDS):
            declare = await fleet.run("service.declare", name="declare", env=env)
            assert declare.process.returncode == 0, declare.text()
            scan = await fleet.run("service.produce", "--scan", name="scan", env=env)
            assert scan.process.returncode == 0, scan.text()
            async with reservations_locked(cluster_database):
                consumer = await fleet.start(
                    "service.consume", name="consumer", env={**env, **PATIENT}
                )
                await eventually(lambda: batch_waits(cluster_database), timeout=60)
                await eventually(lambda: closed(node, cluster_vhost), timeout=30)
                await eventually(lambda: moved(consumer), timeout=30)
            await eventually(lambda: all_expired(cluster_database), timeout=120)
            await eventually(lambda: work_queue_empty(node, cluster_vhost), timeout=120)
            assert await consumer.stop() == 0, consumer.text()
    finally:
        await fleet.reap()
    state = await end_state(cluster_database)
    assert state.statuses == {"expired": LOCKED_HOLDS}
    assert (state.not_once_audited, state.not_once_expired) == ([], [])
    missing = {str(rid) for rid in ids} - fleet.reservations_with("expired")
    if missing:
        raise OutcomeNotLogged(
            f"{len(missing)} of {LOCKED_HOLDS} holds expired (one transition each) without "
            f"an 'expired' outcome line; their outcomes: {sorted(fleet.outcomes().items())}"
        )


# Long enough that the batch waits out the test's lock instead of failing.
PATIENT = {"EXPIRY_LOCK_TIMEOUT_MS": "60000", "EXPIRY_STATEMENT_TIMEOUT_MS": "120000"}


async def batch_waits(url: str) -> bool:
    """Whether a consumer's statement waits for the test's lock."""
    return await consumers_waiting_on_locks(url) >= 1


async def closed(node: ClusterNode, vhost: str) -> bool:
    """Whether the consumer's connection was found (the management API lists a new one
    within a statistics interval) and closed."""
    return await close_connections(node, vhost, "expiry-consume") == 1


async def moved(consumer: ServiceProcess) -> bool:
    """Whether the consumer logged that it turned to the next node."""
    return bool(consumer.named("broker.next_node"))


async def work_queue_empty(node: ClusterNode, vhost: str) -> bool:
    """Whether the redelivered commands were all handled (nothing ready, nothing unacked)."""
    return (await queue_view(node, vhost, "expirations")).get("messages") == 0


async def all_expired(url: str) -> bool:
    """Whether every locked hold is expired now."""
    return await expired_count(url) == LOCKED_HOLDS


class StatusMissedTheCluster(AssertionError):
    """``status`` called the broker unreachable while a node of ``AMQP_URL`` served."""


async def test_status_reads_the_queues_through_another_node_when_the_first_is_down(
    rabbit_cluster: RabbitCluster, cluster_vhost: str, cluster_database: str, tmp_path: Path
) -> None:
    """With the first node of ``AMQP_URL`` stopped, ``python -m service.status`` still reads
    the queues, through the next node."""
    env = service_env(rabbit_cluster.amqp_url(cluster_vhost), cluster_database, "status")
    fleet = Fleet(tmp_path)
    try:
        async with asyncio.timeout(SCENARIO_SECONDS):
            declare = await fleet.run("service.declare", name="declare", env=env)
            assert declare.process.returncode == 0, declare.text()
            await asyncio.to_thread(rabbit_cluster.nodes[0].stop_app)
            status = await fleet.run("service.status", "--json", name="status", env=env)
    finally:
        await fleet.reap()
    if '"broker_error": null' not in status.text():
        raise StatusMissedTheCluster(
            f"exit {status.process.returncode}: "
            + " ".join(line.strip() for line in status.text().splitlines() if "broker" in line)
        )
    # Nothing consumes or scans in this test: the screen says so (4), and only that.
    text = status.text()
    screen, _end = json.JSONDecoder().raw_decode(text, text.index("{\n"))
    assert {p["condition"] for p in screen["problems"]} == {"no-consumer", "no-scan-yet"}
    assert status.process.returncode == 4, status.text()
    assert all(queue["ready"] is not None for queue in screen["queues"])


@pytest.mark.parametrize("departure", ["stop_app", "kill", "partition"])
async def test_leader_node_goes_away_mid_stream(
    rabbit_cluster: RabbitCluster,
    cluster_vhost: str,
    cluster_database: str,
    tmp_path: Path,
    departure: Departure,
) -> None:
    """The work queue's leader goes away mid-stream (stopped, killed, or cut off from the
    other two, where ``pause_minority`` pauses it until the partition heals): consumers and
    scanner move to the other nodes, every hold expires exactly once, nothing confirmed is
    lost or done twice, nothing is dead-lettered, the queues drain."""
    run = Run(
        rabbit_cluster,
        cluster_vhost,
        cluster_database,
        Fleet(tmp_path),
        holds=int(setting("CLUSTER_HOLDS", 8000)),
        spread=setting("CLUSTER_SPREAD_SECONDS", 12),
        departure=departure,
    )
    try:
        async with asyncio.timeout(SCENARIO_SECONDS):
            seen = await scenario(run)
    finally:
        await run.fleet.reap()
    state = await end_state(run.database_url)
    report(figures_of(run, seen, state))
    check(run, seen, state)


def check(run: Run, seen: Observation, state: EndState) -> None:
    """Moved, nothing lost, nothing twice, nothing dead, drained, every process exit 0."""
    departed = seen.departed
    assert departed.expired < run.holds, "every hold had expired before the departure"
    for consumer in run.consumers:
        moves = consumer.named("broker.next_node", departed.offsets[consumer.name])
        assert moves, f"{consumer.name} logged no broker.next_node after the departure"
    assert run.leader.name not in seen.consumer_nodes.values(), seen.consumer_nodes
    offset = departed.offsets[run.scanner.name]
    turned = [
        *run.scanner.named("broker.next_node", offset),
        *run.scanner.named("broker.unreachable", offset),
    ]
    assert turned, "the scanner never turned away from the node that went away"
    after = scans_after(run, departed)
    assert after, "the scanner reported no scan after the departure"
    if seen.departed_before_last_due:
        assert sum(after) > 0, f"holds fell due after the departure; the scans published {after}"
    assert seen.all_expired, f"not every hold expired in time: {state.statuses}"
    assert state.statuses == {"expired": run.holds}
    assert state.not_once_audited == [], "holds without exactly one audited transition"
    assert state.not_once_expired == [], "holds the trigger saw change other than once"
    assert (seen.dead_queue, state.dead_letter_records) == (0, 0), "dead letters"
    assert seen.queues_drained, "the work, retry or dead-log queues did not drain"
    assert seen.exit_codes == dict.fromkeys(seen.exit_codes, 0), seen.exit_codes
