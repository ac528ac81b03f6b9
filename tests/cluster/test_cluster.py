"""Issue 7: the service on a three-node RabbitMQ cluster; the node that leads the work queue
goes away mid-stream.

The real commands (``produce --every 1`` and three ``consume``) run against a
private cluster of the machine's ``rabbitmq-server`` (three nodes joined with
``rabbitmqctl join_cluster``, see ``nodes.py``), with ``AMQP_URL`` naming all
three nodes. Holds fall due over ``CLUSTER_SPREAD_SECONDS`` (30); once a third
of them are expired, the work queue's leader goes away, by ``rabbitmqctl
stop_app`` (the broker closes the connections) or by SIGKILL of the whole
node (no goodbye). ``CLUSTER_HOLDS`` (20000) sets the load.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.cluster.fleet import Fleet
from tests.cluster.nodes import RabbitCluster
from tests.cluster.observe import end_state
from tests.cluster.report import report
from tests.cluster.scenario import (
    Departure,
    Observation,
    Run,
    figures_of,
    scans_after,
    scenario,
    setting,
)

pytestmark = [pytest.mark.faults, pytest.mark.cluster]

SCENARIO_SECONDS = 300.0  # one scenario, the cluster's boot aside


@pytest.mark.parametrize("departure", ["stop_app", "kill"])
async def test_leader_node_goes_away_mid_stream(
    rabbit_cluster: RabbitCluster,
    cluster_vhost: str,
    cluster_database: str,
    tmp_path: Path,
    departure: Departure,
) -> None:
    """The work queue's leader goes away mid-stream: consumers and scanner move to the other
    nodes, every hold expires exactly once, nothing is dead-lettered, the queues drain."""
    run = Run(
        rabbit_cluster,
        cluster_vhost,
        cluster_database,
        Fleet(tmp_path),
        holds=int(setting("CLUSTER_HOLDS", 20000)),
        spread=setting("CLUSTER_SPREAD_SECONDS", 30),
        departure=departure,
    )
    try:
        async with asyncio.timeout(SCENARIO_SECONDS):
            seen = await scenario(run)
    finally:
        await run.fleet.reap()
    report(await figures_of(run, seen))
    await check(run, seen)


async def check(run: Run, seen: Observation) -> None:
    """Moved, nothing lost, nothing twice, nothing dead, drained, every process exit 0."""
    departed = seen.departed
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
    state = await end_state(run.database_url)
    assert seen.all_expired, f"not every hold expired in time: {state.statuses}"
    assert state.statuses == {"expired": run.holds}
    assert state.not_once_audited == [], "holds without exactly one audited transition"
    assert state.not_once_expired == [], "holds the trigger saw change other than once"
    assert (seen.dead_queue, state.dead_letter_records) == (0, 0), "dead letters"
    assert seen.queues_drained, "the work, retry or dead-log queues did not drain"
    assert seen.exit_codes == dict.fromkeys(seen.exit_codes, 0), seen.exit_codes
