"""The on-call's commands: status and verify, as subprocesses against the real services,
in every state a deployment goes through: the verdict line and the exit code of each."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from collections.abc import AsyncIterator
from uuid import UUID

import pytest

from service import scan
from service.adapters import postgres
from tests.outbox_rows import mark_all_sent
from tests.support import (
    Stack,
    eventually,
    free_port,
    insert_holds,
    pg_connection,
    publish_raw,
    run_module,
    running_consumer,
    statuses,
    wait_for_consumers,
)

pytestmark = pytest.mark.acceptance

# A scan pass stays recent for two intervals plus the publish timeout plus 5 s: with a
# long interval, a loaded test machine cannot make the test's own pass look stopped.
RELAXED = {"EXPIRY_SCAN_INTERVAL_SECONDS": "60"}


def command(stack: Stack, module: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m module`` against the test's stack."""
    return run_module(module, *args, env=stack.env(**env))


async def run_command(
    stack: Stack, module: str, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """``command`` in a thread: an in-process consumer keeps running meanwhile."""
    return await asyncio.to_thread(command, stack, module, *args, **env)


def verdict_of(result: subprocess.CompletedProcess[str]) -> str:
    """The first line of the screen."""
    return result.stdout.splitlines()[0] if result.stdout else ""


async def _expired(stack: Stack, count: int) -> bool:
    return (await statuses(stack.database_url)).get("expired", 0) == count


async def _sql(stack: Stack, *statements: str) -> None:
    async with pg_connection(stack.database_url) as conn:
        for statement in statements:
            await conn.execute(statement)


@pytest.fixture
async def consumer(stack: Stack) -> AsyncIterator[None]:
    """A consumer attached to ``expirations`` for the test."""
    async with running_consumer(stack.settings) as task:
        await wait_for_consumers(stack.amqp_url, 1, task)
        yield


# -- status, state by state ------------------------------------------------------------


async def test_status_is_ok_with_a_consumer_and_a_recent_scan(stack: Stack, consumer: None) -> None:
    """All well: exit 0, the verdict OK with ages for people, no problem line."""
    await scan.scan_once(stack.settings)
    result = await run_command(stack, "service.status", **RELAXED)
    assert result.returncode == 0, result.stdout + result.stderr
    assert verdict_of(result).startswith("OK: nothing is due (objective 2m); 1 consumer(s); ")
    assert not [line for line in result.stdout.splitlines() if line.startswith("- ")]
    data = json.loads((await run_command(stack, "service.status", "--json", **RELAXED)).stdout)
    assert (data["exit_code"], data["problems"]) == (0, [])
    assert isinstance(data["scan_passes"][0]["age_seconds"], float)


async def test_status_on_a_database_never_migrated_says_migrate(stack: Stack) -> None:
    """An empty database: exit 5, NOT SET UP with the migrate command, no traceback, and
    the queues still shown."""
    await _sql(stack, "DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    result = await run_command(stack, "service.status")
    assert result.returncode == 5, result.stdout + result.stderr
    assert verdict_of(result).startswith("NOT SET UP: the database is not migrated")
    assert (
        "- the database is not migrated: no schema_migrations table: it was never migrated; "
        "nothing can be scanned or expired. Run python -m service.migrate"
    ) in result.stdout
    assert "database figures not read: PostgreSQL not migrated" in result.stdout
    assert any(line.startswith("expirations.dead.log") for line in result.stdout.splitlines())
    assert "Traceback" not in result.stdout + result.stderr


async def test_status_on_an_older_schema_names_the_missing_migration(stack: Stack) -> None:
    """Migrated by an older release (0010 not applied): exit 5, naming what is missing."""
    await _sql(
        stack,
        "DELETE FROM schema_migrations WHERE version >= '0010'",
        "ALTER TABLE scan_passes DROP COLUMN started_at",
    )
    result = await run_command(stack, "service.status", "--json")
    assert result.returncode == 5, result.stdout + result.stderr
    data = json.loads(result.stdout)
    assert data["verdict"].startswith("NOT SET UP: the database is not migrated")
    assert data["missing_migrations"][0] == "0010_scan_pass_start"
    assert data["problems"][0]["condition"] == "not-migrated"


async def test_status_without_the_topology_says_declare(bare_stack: Stack) -> None:
    """An empty vhost: exit 5, NOT SET UP with the declare command."""
    result = await run_command(bare_stack, "service.status")
    assert result.returncode == 5, result.stdout + result.stderr
    assert verdict_of(result).startswith("NOT SET UP: the topology is not declared")
    assert "Run python -m service.declare" in result.stdout


async def test_status_without_a_consumer_is_degraded(stack: Stack) -> None:
    """Holds published and waiting, nobody consuming: exit 4, saying how many wait."""
    await insert_holds(stack.database_url, 2, due_in=-5)
    await scan.scan_once(stack.settings)
    result = await run_command(stack, "service.status", **RELAXED)
    assert result.returncode == 4, result.stdout + result.stderr
    assert verdict_of(result) == "DEGRADED: no consumer is attached to expirations"
    assert "- no consumer is attached to expirations: 2 due hold(s) wait" in result.stdout


async def test_status_before_any_scan_is_degraded(stack: Stack, consumer: None) -> None:
    """No pass recorded yet: exit 4, saying how to start the scanner."""
    result = await run_command(stack, "service.status")
    assert result.returncode == 4, result.stdout + result.stderr
    assert verdict_of(result) == "DEGRADED: no scan pass has been recorded yet"
    assert "Start the scanner: python -m service.produce --every SECONDS" in result.stdout


async def test_status_with_a_stopped_scanner_is_degraded_unless_it_still_publishes(
    stack: Stack, consumer: None
) -> None:
    """The last pass an hour old: exit 4 (the scanner stopped); a page published a moment
    ago (a long pass under way) keeps it OK."""
    await scan.scan_once(stack.settings)
    await _sql(
        stack,
        "UPDATE scan_passes SET started_at = started_at - interval '1 hour', "
        "finished_at = finished_at - interval '1 hour'",
    )
    result = await run_command(stack, "service.status", **RELAXED)
    assert result.returncode == 4, result.stdout + result.stderr
    assert verdict_of(result) == "DEGRADED: the scanner looks stopped: no pass has ended for 1h"
    assert "STALE" in result.stdout
    [rid] = await insert_holds(stack.database_url, 1, due_in=3600)
    await _sql(
        stack,
        "INSERT INTO publish_leases (reservation_id, message_id, lease_until, first_published, "
        f"last_published, publish_count) VALUES ('{rid}', 'm', now() + interval '5 minutes', "
        "now(), now(), 1)",
    )
    under_way = await run_command(stack, "service.status", **RELAXED)
    assert under_way.returncode == 0, under_way.stdout + under_way.stderr
    assert verdict_of(under_way).startswith("OK: ")


async def test_status_after_a_failed_pass_is_degraded(stack: Stack, consumer: None) -> None:
    """A pass that failed after reaching the database (a lock held on the leases past the
    lock timeout) is recorded as failed: exit 4."""
    await insert_holds(stack.database_url, 1)
    async with pg_connection(stack.database_url) as locker, locker.transaction():
        await locker.execute("LOCK TABLE publish_leases IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(Exception, match="lock timeout"):
            await scan.scan_once(stack.settings)
    result = await run_command(stack, "service.status", **RELAXED)
    assert result.returncode == 4, result.stdout + result.stderr
    assert verdict_of(result) == "DEGRADED: the last scan pass failed"
    assert ": failed, 0 not confirmed" in result.stdout


async def test_status_with_the_broker_down_still_shows_the_database(stack: Stack) -> None:
    """RabbitMQ unreachable: exit 1, DOWN, and the database's figures still shown."""
    result = await run_command(
        stack, "service.status", AMQP_URL=f"amqp://guest:guest@127.0.0.1:{free_port()}/"
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert verdict_of(result).startswith("DOWN: RabbitMQ cannot be reached")
    assert any(line.startswith("oldest due hold") for line in result.stdout.splitlines())


async def test_status_with_the_database_down_still_shows_the_broker(stack: Stack) -> None:
    """PostgreSQL unreachable: exit 1, DOWN, and the queues still shown."""
    result = await run_command(
        stack, "service.status", DATABASE_URL=f"postgresql://postgres@127.0.0.1:{free_port()}/x"
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert verdict_of(result).startswith("DOWN: PostgreSQL cannot be reached")
    assert "database figures not read: PostgreSQL cannot be reached" in result.stdout
    assert any(line.startswith("expirations.dead.log") for line in result.stdout.splitlines())
    assert "Traceback" not in result.stdout + result.stderr


async def test_status_alerts_on_the_age_of_the_oldest_due_hold(
    stack: Stack, consumer: None
) -> None:
    """A hold due 200 s ago, with a consumer and a recent pass, breaks a 60 s objective:
    exit 3, the one problem; the JSON keeps seconds as numbers."""
    await scan.scan_once(stack.settings)
    await insert_holds(stack.database_url, 3, due_in=-200)
    objective = {"EXPIRY_OLDEST_DUE_OBJECTIVE_SECONDS": "60", **RELAXED}
    alert = await run_command(stack, "service.status", **objective)
    assert alert.returncode == 3, alert.stdout + alert.stderr
    assert verdict_of(alert).startswith("ALERT: the oldest due hold is 3m 2")
    assert verdict_of(alert).endswith("old, over the objective of 1m")
    data = json.loads((await run_command(stack, "service.status", "--json", **objective)).stdout)
    assert [problem["condition"] for problem in data["problems"]] == ["objective-breached"]
    assert data["objective_met"] is False
    assert data["backlog"]["oldest_due_age_seconds"] >= 200
    assert data["backlog"]["by_bucket"]["1m_5m"] == 3


async def test_status_alerts_when_events_wait_past_their_objective(
    stack: Stack, consumer: None
) -> None:
    """Events pending for longer than EXPIRY_EVENTS_OBJECTIVE_SECONDS (no relay runs):
    exit 3, the problem says to start the relay; the screen and --json show the outbox."""
    await scan.scan_once(stack.settings)
    await _expired_directly(stack, 3)
    result = await run_command(
        stack, "service.status", EXPIRY_EVENTS_OBJECTIVE_SECONDS="30", **RELAXED
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(
        r"^pending events +3 +the oldest .* within the objective \(30s\)$",
        result.stdout,
        flags=re.MULTILINE,
    ), result.stdout
    await _sql(stack, "UPDATE expiry_events SET created_at = now() - interval '2 minutes'")
    result = await run_command(
        stack, "service.status", "--json", EXPIRY_EVENTS_OBJECTIVE_SECONDS="30", **RELAXED
    )
    assert result.returncode == 3, result.stdout + result.stderr
    data = json.loads(result.stdout)
    assert data["verdict"].startswith("ALERT: the oldest pending event is 2m ")
    [problem] = data["problems"]
    assert problem["condition"] == "events-behind"
    assert "start python -m service.relay, or check it" in problem["todo"]
    assert (data["events"]["pending"], data["events"]["objective_met"]) == (3, False)


async def test_status_counts_open_dead_letters_beside_the_dead_queue(
    stack: Stack, consumer: None
) -> None:
    """Once the holds expired and a poison message is recorded: exit 0, the dead queue and
    the open dead letters agree, the delay queues are one line."""
    await insert_holds(stack.database_url, 5, due_in=-5)
    await scan.scan_once(stack.settings)
    await publish_raw(stack.amqp_url, [b"oops"], message_ids=["poison-s"])
    await eventually(lambda: _expired(stack, 5))
    await eventually(lambda: _dead_recorded(stack))
    await scan.scan_once(stack.settings)
    healthy = await run_command(stack, "service.status", **RELAXED)
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    lines = healthy.stdout.splitlines()
    assert [line.split()[1:] for line in lines if line.startswith("expirations.dead ")] == [
        ["1", "0", "open", "dead", "letters:", "1"]
    ]
    assert [line.split()[:5] for line in lines if line.startswith("expirations.retry")] == [
        ["expirations.retry.*", "(2", "delay", "queues)", "0"]
    ]
    data = json.loads((await run_command(stack, "service.status", "--json", **RELAXED)).stdout)
    assert data["dead_letters_by_class"] == {"poison.not-json": 1}
    assert data["open_dead_letters"] == 1
    assert [q["name"] for q in data["queues"] if q["name"].startswith("expirations.retry")] == [
        "expirations.retry.1s",
        "expirations.retry.2s",
    ]


async def _dead_recorded(stack: Stack) -> bool:
    async with pg_connection(stack.database_url) as conn:
        return bool(await conn.fetchval("SELECT count(*) FROM dead_letters") == 1)


# -- verify ------------------------------------------------------------------------------


async def _run_clean(stack: Stack) -> None:
    await insert_holds(stack.database_url, 50)
    await insert_holds(stack.database_url, 5, due_in=3600)
    async with running_consumer(stack.settings) as task:
        await wait_for_consumers(stack.amqp_url, 1, task)
        await scan.scan_once(stack.settings)
        await eventually(lambda: _expired(stack, 50))


async def test_verify_passes_after_a_clean_run(stack: Stack) -> None:
    """Every expired hold has exactly one transition: exit 0, the verdict first."""
    await _run_clean(stack)
    result = command(stack, "service.verify")
    assert result.returncode == 0, result.stdout + result.stderr
    assert verdict_of(result) == "verify: every effect happened exactly once"
    assert "expired 50" in result.stdout


async def test_verify_catches_a_double_transition_and_an_early_expiry(stack: Stack) -> None:
    """Forged audit rows (a second expiry, an expiry before the deadline) fail verification;
    the second expiry wrote a second event too."""
    await _run_clean(stack)
    async with pg_connection(stack.database_url) as conn:
        # A relay sent the events: else the forged expiry's event would clash with the
        # pending one (the outbox's message id is unique) and the forgery fail whole.
        assert await mark_all_sent(conn) == 50
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
    assert violations["expired-without-exactly-one-event"] == [
        [str(doubled["reservation_id"]), "2 event(s) with its message id"]
    ]


async def _expired_directly(stack: Stack, count: int) -> list[UUID]:
    """``count`` holds expired by the consumer's batched statement, their events pending."""
    ids = await insert_holds(stack.database_url, count)
    async with pg_connection(stack.database_url) as conn:
        await postgres.expire_batch(conn, ids, ["m"] * count, [1] * count, worker="w")
    return ids


async def test_verify_proves_every_expiry_has_its_one_event(stack: Stack) -> None:
    """Expired holds, their events pending or sent: proven, with a line saying how many
    events are sent and pending and since when they are checked."""
    await _expired_directly(stack, 5)
    async with pg_connection(stack.database_url) as conn:
        await mark_all_sent(conn)
    await _expired_directly(stack, 3)
    result = command(stack, "service.verify")
    assert result.returncode == 0, result.stdout + result.stderr
    [line] = [line for line in result.stdout.splitlines() if line.startswith("events: ")]
    assert line.startswith("events: sent 5, pending 3 (the oldest ")
    assert "; checked for the expiries since " in line
    for check in ("expired-without-exactly-one-event", "event-without-its-expiry"):
        assert re.search(rf"^{check} +ok$", result.stdout, flags=re.MULTILINE), check
    data = json.loads(command(stack, "service.verify", "--json").stdout)
    assert (data["events"]["sent"], data["events"]["pending"]) == (5, 3)


PLANTED = {
    "lost": (
        "DELETE FROM expiry_events WHERE reservation_id = $1",
        "expired-without-exactly-one-event",
        "0 event(s) with its message id",
    ),
    "duplicate": (
        "INSERT INTO expiry_events_sent (id, reservation_id, message_id, expired_at,"
        " created_at, claims, relay) SELECT id, reservation_id, message_id, expired_at,"
        " created_at, 1, 'forger' FROM expiry_events WHERE reservation_id = $1",
        "expired-without-exactly-one-event",
        "2 event(s) with its message id",
    ),
    "old-pending": (
        "UPDATE expiry_events SET created_at = now() - interval '2 hours'"
        " WHERE reservation_id = $1",
        "event-pending-too-long",
        "pending for 02:00:",
    ),
    "webhook-lost": (
        "WITH ledger AS (UPDATE schema_migrations SET applied_at = now() - interval '1 hour'"
        "                 WHERE version = '0017_webhook_attempts'),"
        " endpoint AS (INSERT INTO webhook_endpoints (name, registered_at)"
        "              VALUES ('crm', now() - interval '2 hours'))"
        " INSERT INTO webhook_attempts (endpoint, message_id, attempt, kind, status,"
        "                               duration_ms, deliverer)"
        " SELECT 'crm', message_id, 1, 'automatic', 200, 1, 'd' FROM expiry_events"
        "  WHERE reservation_id <> $1",
        "event-without-its-webhook",
        "endpoint crm has neither its delivery (pending or dead) nor a 2xx attempt",
    ),
    "without-expiry": (
        "INSERT INTO expiry_events (reservation_id, hold_until, expired_at, message_id)"
        " SELECT id, hold_until, now(), 'expired:' || id || ':1' FROM reservations"
        " WHERE status = 'held' AND id <> $1 LIMIT 1",
        "event-without-its-expiry",
        "pending event expired:",
    ),
}


@pytest.mark.parametrize("plant", list(PLANTED))
async def test_verify_catches_an_event_lost_doubled_stuck_or_made_up(
    stack: Stack, plant: str
) -> None:
    """A planted violation of the outbox's promise (an event deleted, sent twice, pending
    for two hours, or one of no expiry) or of the webhooks' (an endpoint registered long
    before an event with neither its delivery nor a 2xx attempt of it): exit 1, the verdict
    line naming the check."""
    [rid, _other] = await _expired_directly(stack, 2)
    await insert_holds(stack.database_url, 1, due_in=3600)
    statement, check, fact = PLANTED[plant]
    async with pg_connection(stack.database_url) as conn:
        await conn.execute(statement, rid)
    result = command(stack, "service.verify", "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    data = json.loads(result.stdout)
    assert data["verdict"] == f"verify: FAILED: {check} (1); verify --json lists the reservations"
    [(found, said)] = data["violations"][check]
    assert said.startswith(fact) or fact in said, said
    if plant != "without-expiry":
        assert found == str(rid)
    text = command(stack, "service.verify")
    assert text.returncode == 1
    assert verdict_of(text) == data["verdict"]


async def test_verify_before_any_scan_says_the_holds_await_one(stack: Stack) -> None:
    """A hold due longer than the scan interval, never scanned: not a violation but not
    proven, exit 4, saying how many, since when and that no pass ran; after a scan, 0."""
    await insert_holds(stack.database_url, 1, due_in=-60)
    interval = {"EXPIRY_SCAN_INTERVAL_SECONDS": "10"}
    result = command(stack, "service.verify", **interval)
    assert result.returncode == 4, result.stdout + result.stderr
    verdict = verdict_of(result)
    assert verdict.startswith("verify: no violation, but not proven yet: 1 due hold(s) await a")
    # Due a minute before the command read the clock, however long it took to start.
    assert re.search(r"\(1m( \d{1,2}s)? ago\); last scan pass: never; run the scan", verdict)
    data = json.loads(command(stack, "service.verify", "--json", **interval).stdout)
    assert (data["ok"], data["proven"], data["state"]) == (True, False, "awaiting-scan")
    assert data["violations"]["due-without-live-lease"] == []
    assert data["awaiting_scan"]["holds"] == 1
    await scan.scan_once(stack.settings)  # now it has a live lease
    assert command(stack, "service.verify", **interval).returncode == 0


async def test_verify_catches_a_due_hold_a_scan_skipped(stack: Stack) -> None:
    """A hold due before a pass started, left without a lease by that pass (its row locked
    by another transaction meanwhile): a violation, exit 1, naming it."""
    [rid] = await insert_holds(stack.database_url, 1, due_in=-60)
    async with pg_connection(stack.database_url) as other, other.transaction():
        await other.execute("SELECT 1 FROM reservations WHERE id = $1 FOR UPDATE", rid)
        await scan.scan_once(stack.settings)  # skips the locked row, succeeds
    result = command(stack, "service.verify", "--json", EXPIRY_SCAN_INTERVAL_SECONDS="10")
    assert result.returncode == 1, result.stdout + result.stderr
    data = json.loads(result.stdout)
    [(found, fact)] = data["violations"]["due-without-live-lease"]
    assert found == str(rid)
    assert "lease never taken, left by a scan pass that started" in fact
    assert data["verdict"].startswith("verify: FAILED: due-without-live-lease (1)")


async def test_verify_on_a_database_not_migrated_says_migrate(stack: Stack) -> None:
    """An empty database: exit 5 and one line, no traceback."""
    await _sql(stack, "DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    result = command(stack, "service.verify")
    assert result.returncode == 5, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        "verify: the database is not migrated (no schema_migrations table: it was never "
        "migrated): run python -m service.migrate"
    ]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args",
    [("service.deadletters", "list"), ("service.produce", "--scan"), ("service.consume",)],
    ids=["deadletters", "scan", "consume"],
)
async def test_other_commands_on_a_database_not_migrated_say_migrate(
    stack: Stack, args: tuple[str, ...]
) -> None:
    """deadletters and the scan hit a missing table, a consumer checks at its start: one
    line saying what is missing and the migrate command, exit 5."""
    await _sql(stack, "DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    result = await run_command(stack, *args)
    assert result.returncode == 5, result.stdout + result.stderr
    [line] = [line for line in result.stderr.splitlines() if "not migrated" in line]
    assert line.startswith(f"python -m {args[0]}: the database is not migrated")
    assert line.endswith("): run python -m service.migrate")
    assert "Traceback" not in result.stderr
