"""The commands as a user runs them: ``python -m service.*`` subprocesses."""

from __future__ import annotations

import asyncio
import functools
import json
import signal

import pytest

from service.adapters.postgres.schema import load_migrations
from service.core.domain import command_body
from tests import support
from tests.acceptance.processes import base_env, run, start, stop

pytestmark = pytest.mark.acceptance

COMMANDS = ["service.migrate", "service.produce", "service.consume", "service.relay"]


@pytest.mark.parametrize("module", COMMANDS)
def test_every_command_has_help(module: str) -> None:
    """--help works without any service running."""
    result = run(module, "--help", env=base_env())
    assert result.returncode == 0
    assert "usage: python -m" in result.stdout


@pytest.mark.parametrize("module", COMMANDS)
@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("EXPIRY_PREFETCH", "-1"),
        ("DATABASE_URL", "postgresql://u:hunter2@host:port/db"),
        ("AMQP_URL", "http://u:hunter2@rabbit/"),
    ],
)
def test_bad_configuration_is_one_line_naming_the_setting(
    module: str, name: str, value: str
) -> None:
    """Bad configuration: exit 2, one line that names the setting, no traceback, no password."""
    args = ["--scan"] if module == "service.produce" else []
    result = run(module, *args, env={**base_env(), name: value})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"configuration error: {name}:" in lines[0]
    assert "Traceback" not in result.stderr
    assert "hunter2" not in result.stderr


async def test_migrate_from_two_processes_at_once(stack: support.Stack) -> None:
    """Two concurrent migrations both succeed and leave each version recorded once."""
    async with support.pg_connection(stack.database_url) as conn:
        await conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    env = stack.env()
    first, second = await asyncio.gather(
        asyncio.to_thread(run, "service.migrate", env=env),
        asyncio.to_thread(run, "service.migrate", env=env),
    )
    assert (first.returncode, second.returncode) == (0, 0), first.stderr + second.stderr
    async with support.pg_connection(stack.database_url) as conn:
        versions = await conn.fetch("SELECT version FROM schema_migrations ORDER BY 1")
    assert [v["version"] for v in versions] == [m.version for m in load_migrations()]
    assert len(versions) >= 2


async def test_scan_and_two_consumers_end_to_end(stack: support.Stack) -> None:
    """Scan plus two consumer processes: every due hold expires once; SIGTERM exits 0."""
    due = await support.insert_holds(stack.database_url, 2000)
    await support.insert_holds(stack.database_url, 100, due_in=3600)
    env = stack.env()
    consumers = [await start("service.consume", env=env) for _ in range(2)]
    await support.wait_for_consumers(stack.amqp_url, 2)
    scan = run("service.produce", "--scan", env=env)
    assert scan.returncode == 0, scan.stderr
    assert "published 2000 command(s)" in scan.stdout
    await support.eventually(lambda: _expired(stack, len(due)), timeout=120)
    summaries = []
    for process in consumers:
        code, err = await stop(process)
        assert code == 0, err
        assert "Traceback" not in err
        events = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
        # At the default level no line per delivery: counts in expiry.summary lines.
        assert not [e for e in events if e["event"] == "expiry.outcome"]
        summaries += [e for e in events if e["event"] == "expiry.summary"]
    assert sum(s["expired"] for s in summaries) == len(due)
    assert sum(s["deliveries"] for s in summaries) >= len(due)
    transitions = await support.transitions_per_reservation(stack.database_url)
    assert set(transitions) == set(due)
    assert set(transitions.values()) == {1}
    assert (await support.statuses(stack.database_url))["held"] == 100
    assert await support.queue_depth(stack.amqp_url, "expirations") == 0
    assert await support.queue_depth(stack.amqp_url, "expirations.dead") == 0


async def _expired(stack: support.Stack, count: int) -> bool:
    return (await support.statuses(stack.database_url)).get("expired", 0) == count


async def test_consumer_killed_after_commit_before_ack(stack: support.Stack) -> None:
    """A crash between commit and ack: redelivery finds it already done; one transition."""
    [rid] = await support.insert_holds(stack.database_url, 1)
    crashing = await start("service.consume", env=stack.env(EXPIRY_FAILPOINT="exit-after-commit"))
    await support.wait_for_consumers(stack.amqp_url, 1)
    assert run("service.produce", "--scan", env=stack.env()).returncode == 0
    code, _ = await stop(crashing, signal.SIGCONT)  # exits by itself at the failpoint
    assert code == 137
    assert await support.statuses(stack.database_url) == {"expired": 1}  # committed...
    assert await support.queue_depth(stack.amqp_url, "expirations") == 1  # ...but never acked

    survivor = await start("service.consume", env=stack.env(EXPIRY_LOG_LEVEL="DEBUG"))
    await support.eventually(lambda: _depth_is(stack, 0))
    code, err = await stop(survivor)
    assert code == 0, err
    outcomes = [json.loads(line) for line in err.splitlines() if '"expiry.outcome"' in line]
    assert [(o["outcome"], o["redelivered"]) for o in outcomes] == [("already-done", True)]
    assert await support.transitions_per_reservation(stack.database_url) == {rid: 1}


async def _depth_is(stack: support.Stack, depth: int) -> bool:
    return await support.queue_depth(stack.amqp_url, "expirations") == depth


async def _waiting_on_the_table(stack: support.Stack) -> bool:
    async with support.pg_connection(stack.database_url) as conn:
        waiting: int = await conn.fetchval(
            "SELECT count(*) FROM pg_locks WHERE NOT granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND relation = 'reservations'::regclass"
        )
    return waiting > 0


async def test_sigterm_with_a_full_prefetch_window_drains_and_exits_zero(
    stack: support.Stack,
) -> None:
    """SIGTERM while every prefetched delivery is mid-update: all finish, exit 0, none dead.

    The updates wait on a table lock (maintenance holding ``reservations``, say): a row
    lock would not hold them, a batch skips locked rows."""
    ids = await support.insert_holds(stack.database_url, 20)
    env = stack.env(EXPIRY_PREFETCH="20", EXPIRY_LOCK_TIMEOUT_MS="30000")
    consumer = await start("service.consume", env=env)
    await support.wait_for_consumers(stack.amqp_url, 1)
    async with support.pg_connection(stack.database_url) as holder:
        tx = holder.transaction()
        await tx.start()
        rows = await holder.fetch(
            "SELECT id, hold_until FROM reservations WHERE id = ANY($1::uuid[])", ids
        )
        await holder.execute("LOCK TABLE reservations IN SHARE MODE")
        await support.publish_raw(
            stack.amqp_url, [command_body(r["id"], r["hold_until"]) for r in rows]
        )
        # All 20 delivered (none left ready) and the updates waiting on the table lock:
        # waited for, not slept for, as the consumer may be slow to get there.
        await support.eventually(lambda: _depth_is(stack, 0))
        await support.eventually(lambda: _waiting_on_the_table(stack))
        consumer.send_signal(signal.SIGTERM)
        await asyncio.sleep(1.0)
        assert consumer.returncode is None  # still finishing what it holds
        await tx.commit()
    code, err = await stop(consumer)
    assert code == 0, err
    assert await support.statuses(stack.database_url) == {"expired": 20}
    assert await support.queue_depth(stack.amqp_url, "expirations") == 0
    assert await support.queue_depth(stack.amqp_url, "expirations.dead") == 0


async def test_scan_with_the_broker_down_exits_non_zero_and_records_nothing(
    stack: support.Stack,
) -> None:
    """No broker: exit 1 with a one-line reason (password redacted); no lease recorded."""
    await support.insert_holds(stack.database_url, 5)
    env = stack.env(AMQP_URL="amqp://guest:s3cret@127.0.0.1:1/")
    result = run("service.produce", "--scan", env=env)
    assert result.returncode == 1
    reason = result.stderr.strip().splitlines()[-1]
    assert reason.startswith("python -m service.produce: failed: ConnectionError: cannot reach")
    assert "RabbitMQ at amqp://guest:***@127.0.0.1:1/" in reason
    assert "Traceback" not in result.stderr
    assert "s3cret" not in result.stderr
    async with support.pg_connection(stack.database_url) as conn:
        assert await conn.fetchval("SELECT count(*) FROM publish_leases") == 0


async def test_scan_with_the_database_down_exits_non_zero(stack: support.Stack) -> None:
    """No database: exit 1 with a one-line reason, and nothing published."""
    env = stack.env(DATABASE_URL="postgresql://postgres:s3cret@127.0.0.1:1/nowhere")
    result = run("service.produce", "--scan", env=env)
    assert result.returncode == 1
    assert "cannot reach PostgreSQL at" in result.stderr.strip().splitlines()[-1]
    assert "Traceback" not in result.stderr
    assert "s3cret" not in result.stderr
    assert await support.queue_depth(stack.amqp_url, "expirations") == 0


async def test_scan_on_a_timer_picks_up_new_holds_and_stops_on_sigterm(
    stack: support.Stack,
) -> None:
    """--every keeps scanning: holds inserted later are published; SIGTERM exits 0."""
    scanner = await start("service.produce", "--every", "0.5", env=stack.env())
    await support.insert_holds(stack.database_url, 10)
    await support.eventually(lambda: _leases_are(stack, 10))
    await support.insert_holds(stack.database_url, 5)
    await support.eventually(lambda: _leases_are(stack, 15))
    code, output = await stop(scanner)
    assert code == 0, output
    assert await support.queue_depth(stack.amqp_url, "expirations") == 15


async def _leases_are(stack: support.Stack, count: int) -> bool:
    async with support.pg_connection(stack.database_url) as conn:
        return bool(await conn.fetchval("SELECT count(*) FROM publish_leases") == count)


async def test_a_command_that_kills_its_consumer_is_dead_lettered_alone(
    stack: support.Stack,
) -> None:
    """A message that kills every consumer handling it ends dead after a few crashes;
    its prefetch neighbours, returned with it each time, all expire and none is dead."""
    ids = await support.insert_holds(stack.database_url, 60)
    poison = ids[10]
    env = stack.env(EXPIRY_FAILPOINT=f"exit-on:{poison}", EXPIRY_PREFETCH="100")
    assert run("service.produce", "--scan", env=stack.env()).returncode == 0
    crashes = 0
    async with asyncio.timeout(120):
        while True:  # a supervisor restarting the consumer, as a container platform would
            consumer = await start("service.consume", env=env)
            await support.eventually(
                functools.partial(_exited_or_settled, stack, consumer), timeout=60
            )
            if consumer.returncode is None:
                code, output = await stop(consumer)
                assert code == 0, output
                break
            code, _ = await stop(consumer, signal.SIGCONT)
            assert code == 137
            crashes += 1
    assert crashes <= 4
    assert await support.statuses(stack.database_url) == {"expired": 59, "held": 1}
    await support.eventually(lambda: _dead_is(stack, 1))
    dead = await support.drain_queue(stack.amqp_url, "expirations.dead")
    assert [m.headers["x-expiry-error-class"] for m in dead] == ["consumer-crash"]
    assert str(poison) in dead[0].body.decode()


async def _exited_or_settled(stack: support.Stack, consumer: asyncio.subprocess.Process) -> bool:
    return consumer.returncode is not None or await _settled(stack, 59)


async def _settled(stack: support.Stack, expired: int) -> bool:
    done = (await support.statuses(stack.database_url)).get("expired", 0) == expired
    return done and await support.queue_depth(stack.amqp_url, "expirations.dead") == 1


async def _dead_is(stack: support.Stack, depth: int) -> bool:
    return await support.queue_depth(stack.amqp_url, "expirations.dead") == depth
