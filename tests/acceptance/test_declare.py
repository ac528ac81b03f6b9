"""``python -m service.declare`` as the deploy runs it, and the commands that only check.

The declare step builds the topology in an empty vhost and may run again; the
consumer and the scan refuse to start without it, and on drift, with one line;
and no password shows in any of it.
"""

from __future__ import annotations

import asyncio

import aio_pika
import pytest

from service.core.topology import QUEUE
from tests.acceptance.processes import base_env, run, start, stop
from tests.acceptance.test_secrets import CLOSED, ENCODED, SHOWN_NEVER
from tests.support import Stack, eventually, insert_holds, statuses, wait_for_consumers

pytestmark = pytest.mark.acceptance

MISSING = (
    "python -m service.{}: failed: TopologyMismatch: exchange 'expirations' does not exist "
    "on the broker; declare the topology first: python -m service.declare"
)


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def test_declare_has_help() -> None:
    """--help works without any service running, and says who runs it."""
    result = run("service.declare", "--help", env=base_env())
    assert result.returncode == 0
    assert "usage: python -m service.declare" in result.stdout
    assert "deploy" in result.stdout


async def test_declare_then_the_service_runs(bare_stack: Stack) -> None:
    """In an empty vhost: scan and consumer refuse with one line naming the declare step;
    after ``python -m service.declare`` (twice: idempotent) they run."""
    env = bare_stack.env()
    for module, args in (("produce", ("--scan",)), ("consume", ())):
        refused = await asyncio.to_thread(run, f"service.{module}", *args, env=env)
        assert refused.returncode == 1
        assert _one_line(refused.stderr) == MISSING.format(module)
    for _ in range(2):
        declared = await asyncio.to_thread(run, "service.declare", env=env)
        assert declared.returncode == 0, declared.stderr
        assert declared.stdout.startswith("topology declared: 4 exchange(s), 5 queue(s)")
    ids = await insert_holds(bare_stack.database_url, 5)
    consumer = await start("service.consume", env=env)
    try:
        await wait_for_consumers(bare_stack.amqp_url, 1)
        scan = await asyncio.to_thread(run, "service.produce", "--scan", env=env)
        assert scan.returncode == 0, scan.stderr
        await eventually(lambda: _expired(bare_stack, len(ids)))
    finally:
        code, output = await stop(consumer)
    assert code == 0, output
    assert "topology.arguments_unchecked" not in output


async def _expired(stack: Stack, count: int) -> bool:
    return (await statuses(stack.database_url)).get("expired", 0) == count


async def test_drift_stops_declare_consumer_and_scan_with_one_line(stack: Stack) -> None:
    """A work queue re-declared as a classic queue: each of the three exits 1 with one line
    naming it."""
    connection = await aio_pika.connect(stack.amqp_url)
    async with connection:
        channel = await connection.channel()
        await channel.queue_delete(QUEUE)
        await channel.declare_queue(QUEUE, durable=True)
    env = stack.env()
    for module, args in (("declare", ()), ("consume", ()), ("produce", ("--every", "1"))):
        result = await asyncio.to_thread(run, f"service.{module}", *args, env=env)
        assert result.returncode == 1, result.stderr
        line = _one_line(result.stderr)
        assert line.startswith(
            f"python -m service.{module}: failed: TopologyMismatch: queue 'expirations' exists "
            "on the broker with other settings ("
        ), line


async def test_no_password_when_the_broker_is_away() -> None:
    """Closed ports: the declare step says RabbitMQ cannot be reached, never the password."""
    env = {
        **base_env(),
        "DATABASE_URL": f"postgresql://appuser:{ENCODED}@{CLOSED}/postgres",
        "AMQP_URL": f"amqp://guest:{ENCODED}@{CLOSED}/",
        "EXPIRY_PUBLISH_TIMEOUT_SECONDS": "3",
    }
    for verbose in ([], ["--verbose"]):
        result = await asyncio.to_thread(run, "service.declare", *verbose, env=env)
        assert result.returncode == 1
        output = result.stdout + result.stderr
        assert [s for s in SHOWN_NEVER if s in output] == []
        reports = [
            line for line in result.stderr.splitlines() if line.startswith("python -m service.")
        ]
        assert len(reports) == 1
        assert "RabbitMQ" in reports[0]


async def test_no_password_when_the_management_api_refuses_it(stack: Stack) -> None:
    """The management API refuses the consumer's login: one warning without the password,
    and the consumer runs."""
    refused = (stack.settings.management_url or "").replace("://", f"://nobody:{ENCODED}@", 1)
    env = stack.env(EXPIRY_MANAGEMENT_URL=refused)
    consumer = await start("service.consume", env=env)
    try:
        await wait_for_consumers(stack.amqp_url, 1)
    finally:
        code, output = await stop(consumer)
    assert code == 0, output
    assert [s for s in SHOWN_NEVER if s in output] == []
    assert output.count('"topology.arguments_unchecked"') == 1, output
    assert "HTTP 401" in output
