"""The on-call's commands: status and verify, as subprocesses against the real services."""

from __future__ import annotations

import json
import subprocess

import pytest

from service import scan
from tests.support import (
    Stack,
    eventually,
    insert_holds,
    pg_connection,
    publish_raw,
    run_module,
    running_consumer,
    statuses,
    wait_for_consumers,
)

pytestmark = pytest.mark.acceptance


def command(stack: Stack, module: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m module`` against the test's stack."""
    return run_module(module, *args, env=stack.env(**env))


async def _expired(stack: Stack, count: int) -> bool:
    return (await statuses(stack.database_url)).get("expired", 0) == count


async def test_status_alerts_on_the_age_of_the_oldest_due_hold(stack: Stack) -> None:
    """A hold due 200 s ago and unprocessed breaks a 60 s objective: exit 3; once expired, 0."""
    await insert_holds(stack.database_url, 3, due_in=-200)
    await insert_holds(stack.database_url, 2, due_in=-5)
    objective = {"EXPIRY_OLDEST_DUE_OBJECTIVE_SECONDS": "60"}
    alert = command(stack, "service.status", **objective)
    assert alert.returncode == 3, alert.stdout + alert.stderr
    assert "ALERT" in alert.stdout
    data = json.loads(command(stack, "service.status", "--json", **objective).stdout)
    assert data["objective_met"] is False
    assert data["backlog"]["oldest_due_age_seconds"] >= 200
    assert data["backlog"]["by_bucket"]["1m_5m"] == 3
    assert data["backlog"]["total"] == 5

    async with running_consumer(stack.settings) as task:
        await wait_for_consumers(stack.amqp_url, 1, task)
        await scan.scan_once(stack.settings)
        await publish_raw(stack.amqp_url, [b"oops"], message_ids=["poison-s"])
        await eventually(lambda: _expired(stack, 5))
        await eventually(lambda: _dead_recorded(stack))
        healthy = command(stack, "service.status", "--json", **objective)
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    data = json.loads(healthy.stdout)
    assert data["objective_met"] is True
    assert data["backlog"]["total"] == 0
    assert data["dead_letters_by_class"] == {"poison.not-json": 1}
    queues = {q["name"]: q for q in data["queues"]}
    assert queues["expirations"]["consumers"] == 1
    assert queues["expirations.dead"]["ready"] == 1


async def _dead_recorded(stack: Stack) -> bool:
    async with pg_connection(stack.database_url) as conn:
        return bool(await conn.fetchval("SELECT count(*) FROM dead_letters") == 1)


async def test_status_with_the_broker_down_exits_one(stack: Stack) -> None:
    """The screen still shows the database's view, and says the broker is unreachable."""
    result = command(stack, "service.status", AMQP_URL="amqp://guest:guest@127.0.0.1:1/")
    assert result.returncode == 1
    assert "broker unreachable" in result.stdout
    assert "oldest due hold" in result.stdout


async def _run_clean(stack: Stack) -> None:
    await insert_holds(stack.database_url, 50)
    await insert_holds(stack.database_url, 5, due_in=3600)
    async with running_consumer(stack.settings) as task:
        await wait_for_consumers(stack.amqp_url, 1, task)
        await scan.scan_once(stack.settings)
        await eventually(lambda: _expired(stack, 50))


async def test_verify_passes_after_a_clean_run(stack: Stack) -> None:
    """Every expired hold has exactly one transition: exit 0."""
    await _run_clean(stack)
    result = command(stack, "service.verify")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "expired 50" in result.stdout
    assert "every effect happened exactly once" in result.stdout


async def test_verify_catches_a_double_transition_and_an_early_expiry(stack: Stack) -> None:
    """Forged audit rows (a second expiry, an expiry before the deadline) fail verification."""
    await _run_clean(stack)
    async with pg_connection(stack.database_url) as conn:
        doubled = await conn.fetchrow(
            "SELECT reservation_id FROM reservation_transitions ORDER BY id LIMIT 1"
        )
        assert doubled is not None
        await conn.execute(
            "INSERT INTO reservation_transitions (reservation_id, from_status, to_status, worker)"
            " VALUES ($1, 'held', 'expired', 'forger')",
            doubled["reservation_id"],
        )
        [future] = await conn.fetch(
            "INSERT INTO reservations (id, hold_until, status) "
            "VALUES (gen_random_uuid(), now() + interval '1 hour', 'expired') RETURNING id"
        )
        await conn.execute(
            "INSERT INTO reservation_transitions (reservation_id, from_status, to_status, worker)"
            " VALUES ($1, 'held', 'expired', 'forger')",
            future["id"],
        )
    result = command(stack, "service.verify", "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    violations = json.loads(result.stdout)["violations"]
    assert [v[0] for v in violations["expired-without-exactly-one-transition"]] == [
        str(doubled["reservation_id"])
    ]
    assert [v[0] for v in violations["expired-before-deadline"]] == [str(future["id"])]


async def test_verify_catches_a_due_hold_nobody_published(stack: Stack) -> None:
    """A hold due longer than the scan interval without a live lease is a violation."""
    [rid] = await insert_holds(stack.database_url, 1, due_in=-60)
    result = command(stack, "service.verify", "--json", EXPIRY_SCAN_INTERVAL_SECONDS="10")
    assert result.returncode == 1
    assert [v[0] for v in json.loads(result.stdout)["violations"]["due-without-live-lease"]] == [
        str(rid)
    ]
    await scan.scan_once(stack.settings)  # now it has a live lease
    assert command(stack, "service.verify", EXPIRY_SCAN_INTERVAL_SECONDS="10").returncode == 0
