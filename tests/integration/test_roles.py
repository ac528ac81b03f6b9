"""Least privilege in the database: each command works as its role, and can do no more.

The runtime roles (``expiry_consumer``, ``expiry_scan``, ``expiry_operator``)
are created by migration 0005, ``expiry_relay`` by 0014, ``expiry_deliver`` by 0015, and
shared by every database
of the cluster; the tests log in as them (the local server trusts every role) and never
change them. Tests that need roles of their own (missing, or racing to be
created) run the migrations with the role names made unique, and drop what
they created.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import httpx
import pytest

from service import scan
from service.adapters import postgres
from service.adapters.postgres import audit_trail, deliveries, outbox, webhook_endpoints
from service.adapters.postgres.schema import (
    MIGRATION_LOCK_KEY,
    Migration,
    load_migrations,
    migrate,
    schema_state,
)
from service.adapters.telemetry.metrics import Metrics
from service.cli import cause_chain
from service.core.dead_letter import DeadLetterRecord
from service.core.default_owners import DEFAULT_OPERATOR, OwnerRule, parse_owner_rules
from service.core.domain import Outcome, command_body, message_id
from service.core.errors import UsageError
from service.core.recorded_policy import Policy, policy_in_force
from service.ops import housekeeping
from service.settings import Settings
from tests import support
from tests.support import as_role
from tests.webhook_support import attempted

# one_broker: the grants of PostgreSQL's roles: the scans, replays and queues it uses are the
# pipeline's and dead letters' own, tested on every broker version.
pytestmark = [pytest.mark.integration, pytest.mark.one_broker]
REPO = Path(__file__).resolve().parents[2]

CONSUMER = "expiry_consumer"
SCAN = "expiry_scan"
OPERATOR = "expiry_operator"
RELAY = "expiry_relay"
DELIVER = "expiry_deliver"
RUNTIME_ROLES = (CONSUMER, SCAN, OPERATOR)  # migration 0005's
EVERY_ROLE = (*RUNTIME_ROLES, RELAY, DELIVER)  # 0014_events's and 0015_webhooks's too
ROLES_MIGRATION = "0005_roles"
TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"

# -- helpers ------------------------------------------------------------------------


def role_settings(stack: support.Stack, role: str, **overrides: object) -> Settings:
    """The stack's settings, connecting to its database as ``role``."""
    return stack.settings.model_copy(
        update={"database_url": as_role(stack.database_url, role), **overrides}
    )


@contextlib.asynccontextmanager
async def connected_as(url: str, role: str) -> AsyncIterator[asyncpg.Connection[asyncpg.Record]]:
    """A connection to the database of ``url`` as ``role``."""
    async with support.pg_connection(as_role(url, role)) as conn:
        yield conn


def command(
    module: str, stack: support.Stack, role: str, *args: str
) -> subprocess.CompletedProcess[str]:
    """``python -m <module> args`` against the stack as ``role`` (alice may replay)."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        env=stack.env(
            DATABASE_URL=as_role(stack.database_url, role), EXPIRY_REPLAY_OPERATORS="alice"
        ),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def admin(url: str, *statements: str) -> None:
    """Run ``statements`` on the server of ``url`` as its (superuser) user."""
    async with support.pg_connection(url) as conn:
        for statement in statements:
            await conn.execute(statement)


@contextlib.asynccontextmanager
async def scratch_database(
    endpoints: support.Endpoints, *, owner: str | None = None
) -> AsyncIterator[str]:
    """An empty database of this test (owned by ``owner``); its URL, as the superuser."""
    name = f"expiry_roles_{support.RUN_ID}_{uuid.uuid4().hex[:8]}"
    owned = f" OWNER {owner}" if owner else ""
    await admin(endpoints.database_url, f"CREATE DATABASE {name}{owned}")
    try:
        yield support.with_database(endpoints.database_url, name)
    finally:
        await admin(endpoints.database_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@contextlib.asynccontextmanager
async def throwaway_roles(endpoints: support.Endpoints, *names: str) -> AsyncIterator[None]:
    """Drop ``names`` afterwards (drop their databases first: grants pin a role)."""
    try:
        yield
    finally:
        await admin(endpoints.database_url, *(f"DROP ROLE IF EXISTS {name}" for name in names))


def renamed_roles(suffix: str) -> dict[str, str]:
    """Runtime role name -> a name unique to one test."""
    return {
        role: f"xr_{support.RUN_ID}_{suffix}_{role.removeprefix('expiry_')}" for role in EVERY_ROLE
    }


def renamed(sql: str, names: dict[str, str]) -> str:
    """``sql`` with the runtime roles renamed."""
    pattern = re.compile(r"\b(" + "|".join(EVERY_ROLE) + r")\b")
    return pattern.sub(lambda match: names[match.group(1)], sql)


def roles_migration(names: dict[str, str]) -> str:
    """Migration 0005 with the runtime roles renamed (so that they are missing)."""
    [sql] = [m.sql for m in load_migrations() if m.version == ROLES_MIGRATION]
    return renamed(sql, names)


def migrations_with(names: dict[str, str]) -> list[Migration]:
    """Every migration, with renamed roles (0005 and 0014 create and grant them)."""
    return [Migration(m.version, renamed(m.sql, names)) for m in load_migrations()]


def before_roles() -> list[Migration]:
    """The migrations that come before 0005."""
    return [m for m in load_migrations() if m.version < ROLES_MIGRATION]


@contextlib.contextmanager
def migrations_replaced(monkeypatch: pytest.MonkeyPatch, chosen: list[Migration]) -> Iterator[None]:
    """``migrate()`` applies ``chosen`` instead of the shipped migrations."""
    with monkeypatch.context() as patch:
        patch.setattr("service.adapters.postgres.schema.load_migrations", lambda: chosen)
        yield


def dead_letter(message: str, *, last_seen: datetime) -> DeadLetterRecord:
    """A dead-letter record as the recorder writes it."""
    return DeadLetterRecord(
        message_id=message,
        reservation_id=None,
        hold_until=None,
        error_class="poison.not-json",
        give_up="permanent",
        reason="not JSON",
        attempts=1,
        first_seen=last_seen - timedelta(seconds=1),
        last_seen=last_seen,
        worker="test",
        body_excerpt="<xxxx>",
    )


async def applied_versions(url: str) -> list[str]:
    """The versions that ``schema_migrations`` records."""
    async with support.pg_connection(url) as conn:
        rows = await conn.fetch("SELECT version FROM schema_migrations ORDER BY 1")
    return [row["version"] for row in rows]


# -- every command does its whole job as its role ------------------------------------


async def test_the_scan_claims_publishes_and_records_leases_as_expiry_scan(
    stack: support.Stack,
) -> None:
    """``produce.scan`` as expiry_scan publishes every due hold once and records its leases."""
    due = await support.insert_holds(stack.database_url, 30)
    await support.insert_holds(stack.database_url, 5, due_in=3600)
    settings = role_settings(stack, SCAN, scan_batch_size=7)  # several pages, pipelined
    assert (await scan.scan_once(settings)).published == 30
    assert (await scan.scan_once(settings)).published == 0  # every lease is live
    assert await support.queue_depth(stack.amqp_url, "expirations") == 30
    async with support.pg_connection(stack.database_url) as conn:
        leases = await conn.fetch("SELECT reservation_id, publish_count FROM publish_leases")
    assert {row["reservation_id"] for row in leases} == set(due)
    assert {row["publish_count"] for row in leases} == {1}


async def test_the_consumer_expires_and_records_dead_letters_as_expiry_consumer(
    stack: support.Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """A consumer as expiry_consumer expires due holds once, retries nothing, records poison
    with its policy and its default owner (audited as expiry_consumer), reads the gauges."""
    caplog.set_level(logging.INFO)
    due = await support.insert_holds(stack.database_url, 40)
    future = await support.insert_holds(stack.database_url, 5, due_in=3600)
    port = support.free_port()
    owners = parse_owner_rules("db.*=team-db,poison.*=team-producers")
    settings = role_settings(stack, CONSUMER, http_port=port, dead_letter_owners=owners)
    metrics = Metrics()
    async with support.attached_consumer(stack, settings, metrics=metrics, backlog_every=0.2):
        assert (await scan.scan_once(role_settings(stack, SCAN))).published == len(due)
        await support.publish_raw(
            stack.amqp_url, [b"<html>not a command</html>"], message_ids=["junk"]
        )
        await support.eventually(lambda: _expired_and_recorded(stack, len(due), ["junk"]))
        await support.eventually(lambda: _gauges_read(metrics, open_classes={"poison.not-json": 1}))
        async with httpx.AsyncClient() as client:
            ready = await client.get(f"http://127.0.0.1:{port}/readyz")
        assert ready.status_code == 200, ready.text
    assert await support.statuses(stack.database_url) == {"expired": len(due), "held": len(future)}
    assert await support.transitions_per_reservation(stack.database_url) == dict.fromkeys(due, 1)
    assert await support.queue_depth(stack.amqp_url, "expirations.dead") == 1
    events = [record.getMessage() for record in caplog.records]
    assert "expiry.retry" not in events
    complaints = [
        record.getMessage()
        for record in caplog.records
        if record.levelno >= logging.WARNING and record.getMessage() != "expiry.dead_letter"
    ]
    assert complaints == []  # no refused statement, backlog gauge or dead-letter record
    async with support.pg_connection(stack.database_url) as conn:
        record = await conn.fetchrow("SELECT id, owner, policy FROM dead_letters")
        assert record is not None
        audit = await conn.fetch(
            "SELECT kind, operator, detail, db_user FROM dead_letter_events "
            "WHERE dead_letter_id = $1",
            record["id"],
        )
    assert record["owner"] == "team-producers"
    assert Policy.from_json(record["policy"]) == policy_in_force(settings)
    assert [tuple(event) for event in audit] == [
        ("assigned", DEFAULT_OPERATOR, "team-producers (error class matched poison.*)", CONSUMER)
    ]
    assert metrics.gauges.unowned_dead_letters == 0  # read as expiry_consumer


async def _gauges_read(metrics: Metrics, *, open_classes: dict[str, int]) -> bool:
    """Whether the consumer's gauges have read the open dead letters and their owners."""
    gauges = metrics.gauges
    return (
        gauges.open_dead_letters == open_classes
        and gauges.unowned_dead_letters == 0
        and gauges.oldest_open_dead_letter_age_seconds is not None
    )


async def _expired_and_recorded(stack: support.Stack, expired: int, message_ids: list[str]) -> bool:
    async with support.pg_connection(stack.database_url) as conn:
        done = await conn.fetchval("SELECT count(*) FROM reservations WHERE status = 'expired'")
        recorded = await conn.fetch("SELECT message_id FROM dead_letters")
    return done == expired and sorted(row["message_id"] for row in recorded) == sorted(message_ids)


async def test_the_operator_lists_shows_replays_and_checks_as_expiry_operator(
    stack: support.Stack,
) -> None:
    """deadletters list/show/replay, status and verify all work as expiry_operator."""
    [held] = await support.insert_holds(stack.database_url, 1)
    unknown = uuid.uuid4()
    deadline = datetime(2020, 1, 1, tzinfo=UTC)
    async with support.attached_consumer(stack, role_settings(stack, CONSUMER)):
        assert (await scan.scan_once(role_settings(stack, SCAN))).published == 1
        await support.publish_raw(
            stack.amqp_url,
            [b"<html>not a command</html>", command_body(unknown, deadline)],
            message_ids=["junk", message_id(unknown, deadline)],
        )
        both = ["junk", message_id(unknown, deadline)]
        await support.eventually(lambda: _expired_and_recorded(stack, 1, both))
        records = await _dead_letter_ids(stack)

        listing = command("service.deadletters", stack, OPERATOR, "list")
        assert listing.returncode == 0, listing.stderr
        assert "poison.not-json" in listing.stdout
        for record_id in records.values():  # the unknown one reads transitions and state too
            shown = command("service.deadletters", stack, OPERATOR, "show", str(record_id))
            assert shown.returncode == 0, shown.stderr
        replay_args = ("replay", str(records["junk"]), "--operator", "alice")
        replay = command("service.deadletters", stack, OPERATOR, *replay_args)
        assert replay.returncode == 0, replay.stdout + replay.stderr
        assert "republished" in replay.stdout
        await support.eventually(
            lambda: _times_dead(stack, "junk", 2)
        )  # the recorder's update path

    status = command("service.status", stack, OPERATOR, "--json")
    assert status.returncode == 4, status.stdout + status.stderr  # the consumer has stopped
    assert "no-consumer" in [p["condition"] for p in json.loads(status.stdout)["problems"]]
    assert json.loads(status.stdout)["dead_letters_by_class"]["poison.not-json"] == 1
    verify = command("service.verify", stack, OPERATOR)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    async with support.pg_connection(stack.database_url) as conn:
        audit = await conn.fetch("SELECT operator, outcome, db_user FROM dead_letter_replays")
    assert [tuple(row) for row in audit] == [("alice", "republished", OPERATOR)]
    assert await support.transitions_per_reservation(stack.database_url) == {held: 1}


async def _dead_letter_ids(stack: support.Stack) -> dict[str, int]:
    async with support.pg_connection(stack.database_url) as conn:
        rows = await conn.fetch("SELECT message_id, id FROM dead_letters")
    return {row["message_id"]: row["id"] for row in rows}


async def _times_dead(stack: support.Stack, key: str, times: int) -> bool:
    async with support.pg_connection(stack.database_url) as conn:
        row = await conn.fetchrow(
            "SELECT times_dead, status FROM dead_letters WHERE message_id = $1", key
        )
    return row is not None and (row["times_dead"], row["status"]) == (times, "dead")


# -- every statement of each role, including the rare paths --------------------------


async def test_every_statement_of_the_consumer_runs_as_expiry_consumer(
    stack: support.Stack,
) -> None:
    """Guarded updates, crash counts, dead-letter upserts and the gauges run as the consumer."""
    first, second, third, fourth = await support.insert_holds(stack.database_url, 4)
    [future] = await support.insert_holds(stack.database_url, 1, due_in=3600)
    async with connected_as(stack.database_url, CONSUMER) as conn:
        await postgres.ping(conn)
        assert (await postgres.backlog(conn)).total == 4
        expire = postgres.expire_reservation
        assert (await expire(conn, first, message_id="m1", attempt=1, worker="w")).outcome == (
            Outcome.EXPIRED
        )
        assert (await expire(conn, first, message_id="m1", attempt=2, worker="w")).outcome == (
            Outcome.ALREADY_DONE
        )
        assert (await expire(conn, future, message_id="m4", attempt=1, worker="w")).outcome == (
            Outcome.NOT_ELIGIBLE
        )
        batch = await postgres.expire_batch(
            conn, [first, second, third], ["m1", "m2", "m3"], [3, 1, 1], worker="w"
        )
        assert {rid: row.won for rid, row in batch.items()} == {
            first: False,
            second: True,
            third: True,
        }
        assert await postgres.reservation_state(conn, second) == ("expired", True)
        traced = await postgres.expire_batch(conn, [fourth], ["m6"], [1], [TRACE], worker="w")
        assert traced[fourth].won
        assert (await outbox.pending(conn)).count == 4  # the gauges read the outbox's backlog
        await outbox.notify(conn)  # wakes the relays
        assert await postgres.mark_handling(conn, "m5") == 1
        assert await postgres.mark_handling(conn, "m5") == 2  # the upsert's update path
        await postgres.clear_handling(conn, "m5")
        now = datetime.now(UTC)
        await postgres.record_dead_letter(conn, dead_letter("junk", last_seen=now))
        await postgres.record_dead_letter(
            conn, dead_letter("junk", last_seen=now)
        )  # the same: no-op
        await postgres.record_dead_letter(
            conn, dead_letter("junk", last_seen=now + timedelta(seconds=1))
        )
        assert await postgres.unowned_and_oldest_open(conn) == (1, 0.0)  # last seen ahead
        rule, policy = OwnerRule("poison.*", "team-producers"), Policy((1, 5), 3, 60, 10)
        later = dead_letter("junk", last_seen=now + timedelta(seconds=2))
        assert await postgres.record_dead_letter(conn, later, policy=policy, owner=rule)
        assert not await postgres.record_dead_letter(conn, later, policy=policy, owner=rule)
        assert await postgres.unowned_and_oldest_open(conn) == (0, 0.0)
    async with support.pg_connection(stack.database_url) as conn:
        row = await conn.fetchrow("SELECT times_dead, owner, policy FROM dead_letters")
        assert row is not None
        times_dead, owner, stored = row
        crashes = await conn.fetchval("SELECT count(*) FROM delivery_crashes")
        audit = await conn.fetch("SELECT kind, operator, db_user FROM dead_letter_events")
        written = await conn.fetch("SELECT reservation_id, traceparent FROM expiry_events")
    assert (times_dead, crashes, owner, Policy.from_json(stored)) == (3, 0, rule.owner, policy)
    assert [tuple(event) for event in audit] == [("assigned", DEFAULT_OPERATOR, CONSUMER)]
    assert await support.transitions_per_reservation(stack.database_url) == dict.fromkeys(
        (first, second, third, fourth), 1
    )
    assert {row["reservation_id"] for row in written} == {first, second, third, fourth}
    assert {row["traceparent"] for row in written if row["reservation_id"] == fourth} == {TRACE}


async def test_every_statement_of_the_relay_runs_as_expiry_relay(stack: support.Stack) -> None:
    """Claims, marks (only while the lease holds), releases, the backlog, the wake-up and
    the schema check all run as the relay."""
    ids = await support.insert_holds(stack.database_url, 3)
    async with connected_as(stack.database_url, CONSUMER) as conn:
        await postgres.expire_batch(conn, ids, ["a", "b", "c"], [1, 1, 1], worker="w")
    token, other = uuid.uuid4(), uuid.uuid4()
    async with connected_as(stack.database_url, RELAY) as conn:
        assert (await schema_state(conn)).current
        claimed = await outbox.claim_events(conn, 2, lease_seconds=30, token=token)
        assert len(claimed) == 2
        assert await outbox.mark_sent(conn, [claimed[0].id], token=other, relay="r") == 0
        assert await outbox.mark_sent(conn, [claimed[0].id], token=token, relay="r") == 1
        await outbox.release_claim(conn, [claimed[1].id], token=token)
        again = await outbox.claim_events(conn, 10, lease_seconds=30, token=other)
        assert len(again) == 2
        assert max(event.claims for event in again) == 2  # claimed before
        assert (await outbox.pending(conn)).count == 2
        await outbox.notify(conn)
    async with support.pg_connection(stack.database_url) as conn:
        sent = await conn.fetch("SELECT reservation_id, relay FROM expiry_events_sent")
    assert [tuple(row) for row in sent] == [(claimed[0].reservation_id, "r")]


async def test_every_statement_of_the_deliverer_runs_as_expiry_deliver(
    stack: support.Stack,
) -> None:
    """Registering, the shared bucket, pause and hold, claims, settling (delivered, put
    off, dead with its record and default owner), disabling and enabling run as the
    deliverer; a consumer's expiry writes the deliveries; the operator reads the backlog
    and revives a dead one."""
    async with connected_as(stack.database_url, DELIVER) as conn:
        assert (await schema_state(conn)).current
        await webhook_endpoints.register(conn, ["a", "b"])
    ids = await support.insert_holds(stack.database_url, 3)
    async with connected_as(stack.database_url, CONSUMER) as conn:
        await postgres.expire_batch(conn, ids, ["x", "y", "z"], [1, 1, 1], worker="w")
    token = uuid.uuid4()
    rule = OwnerRule("webhook.*", "team-hooks")
    async with connected_as(stack.database_url, DELIVER) as conn:
        # A rate of a million a second fills the bucket (burst 10) within microseconds of
        # the registration, however fast or slow the statements above ran. Five granted,
        # the three due claimed (and only their tokens taken).
        claim = await deliveries.claim(
            conn,
            "a",
            5,
            rate=1_000_000,
            burst=10,
            probe_seconds=30,
            lease_seconds=30,
            token=token,
        )
        assert claim.tokens.granted == 5
        claimed = claim.deliveries
        [one, two, three] = claimed
        assert await deliveries.delivered(
            conn, one.id, token=token, attempted=attempted("a", one.message_id)
        )
        assert await deliveries.put_off(
            conn,
            two.id,
            token=token,
            seconds=60,
            attempted=attempted("a", two.message_id, 503, "x"),
        )
        record = DeadLetterRecord(
            message_id=f"webhook:a:{claimed[2].message_id}",
            reservation_id=claimed[2].reservation_id,
            hold_until=claimed[2].hold_until,
            error_class="webhook.rejected",
            give_up="attempts-exhausted",
            reason="endpoint a: HTTP 400",
            attempts=1,
            first_seen=datetime.now(UTC),
            last_seen=datetime.now(UTC),
            worker="d",
            body_excerpt=None,
        )
        assert await deliveries.kill(
            conn,
            three.id,
            token=token,
            attempted=attempted("a", three.message_id, 400, "webhook.rejected"),
            dead_letter=record,
            owner=rule,
        )
        assert await webhook_endpoints.failed(conn, "b", pause_after=1, first=30, cap=60)
        await webhook_endpoints.hold(conn, "b", 5.0)
        assert await webhook_endpoints.disable(conn, "b")
        enabled = await webhook_endpoints.enable(conn, "b")
        assert (enabled.registered, enabled.disabled_at is not None, enabled.pending) == (
            True,
            True,
            3,
        )
    async with connected_as(stack.database_url, OPERATOR) as conn:
        backlog = {
            row.endpoint: (row.pending, row.dead) for row in await webhook_endpoints.backlog(conn)
        }
        assert backlog == {"a": (1, 1), "b": (3, 0)}
        assert await deliveries.revive(conn, "a", claimed[2].message_id)
        owner = await conn.fetchval("SELECT owner FROM dead_letters")
    assert owner == "team-hooks"


async def test_every_statement_of_the_scan_runs_as_expiry_scan(stack: support.Stack) -> None:
    """Claims, lease takeovers, records and releases all run as the scan."""
    ids = await support.insert_holds(stack.database_url, 4)
    messages = [f"m{n}" for n in range(4)]
    async with connected_as(stack.database_url, SCAN) as conn:
        until = await postgres.db_now(conn)
        start = (postgres.EPOCH_START, postgres.NIL_UUID)
        async with conn.transaction():
            page = await postgres.claim_due(conn, until=until, after=start, limit=10)
            claimed = await postgres.claim_leases(conn, ids, messages, claim_seconds=5)
        assert {hold.id for hold in page} == claimed == set(ids)
        await postgres.record_leases(conn, ids[:2], lease_seconds=300)
        await postgres.release_claims(conn, ids[2:])
        async with conn.transaction():  # the released claims are taken over
            page = await postgres.claim_due(
                conn, until=await postgres.db_now(conn), after=start, limit=10
            )
            claimed = await postgres.claim_leases(conn, ids, messages, claim_seconds=5)
        assert {hold.id for hold in page} == claimed == set(ids[2:])


async def test_every_statement_of_the_operator_runs_as_expiry_operator(
    stack: support.Stack,
) -> None:
    """Listing, showing, auditing replays, status and verify's queries run as the operator."""
    [rid] = await support.insert_holds(stack.database_url, 1)
    async with connected_as(stack.database_url, CONSUMER) as conn:
        await postgres.expire_reservation(conn, rid, message_id="m1", attempt=1, worker="w")
        await postgres.record_dead_letter(conn, dead_letter("junk", last_seen=datetime.now(UTC)))
    actor = postgres.Actor("alice", "os-user", "host")
    async with connected_as(stack.database_url, OPERATOR) as conn:
        [row] = await postgres.list_dead_letters(
            conn, status="dead", error_class=None, older_than=None, newer_than=60, limit=10
        )
        assert await postgres.get_dead_letter(conn, "junk") == row
        assert await postgres.dead_letters_by_class(conn) == {"poison.not-json": 1}
        assert len(await postgres.transitions_of(conn, rid)) == 1
        assert await postgres.reservation_state(conn, rid) == ("expired", True)
        for outcome in ("refused", "republished"):
            await postgres.record_replay(
                conn, row["id"], "junk", actor=actor, outcome=outcome, detail="test"
            )
        replays = await postgres.replays_of(conn, row["id"])
        assert [(r["outcome"], r["db_user"]) for r in replays] == [
            ("refused", OPERATOR),
            ("republished", OPERATOR),
        ]
        replayed = await postgres.get_dead_letter(conn, "junk")
        assert replayed is not None
        assert replayed["status"] == "replayed"
        assert (await postgres.backlog(conn)).total == 0
        assert (await schema_state(conn)).current  # status and verify read the ledger
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            await postgres.prepare_verification(conn)
            assert (await postgres.verify_totals(conn))["expired"] == 1
            for name in postgres.VERIFY_CHECKS:
                assert await postgres.verify_check(conn, name, limit=10, scan_interval=5) == []
            for name in audit_trail.EVENT_CHECKS:
                found = await audit_trail.verify_event_check(
                    conn, name, limit=10, pending_bound=3600
                )
                assert found == []
            totals = await audit_trail.event_totals(conn)
            assert (totals.pending, totals.sent) == (1, 0)
        assert (await outbox.pending(conn)).count == 1  # status reads the outbox's backlog


# -- and no more ----------------------------------------------------------------------

NIL = "'00000000-0000-0000-0000-000000000000'"
CANNOT = {
    CONSUMER: [
        "DELETE FROM reservations",
        "UPDATE reservations SET hold_until = now()",
        f"INSERT INTO reservations (id, hold_until) VALUES ({NIL}, now())",
        f"INSERT INTO publish_leases (reservation_id, message_id, lease_until) "
        f"VALUES ({NIL}, 'm', now())",
        "UPDATE publish_leases SET lease_until = now()",
        "SELECT message_id, lease_until FROM publish_leases",
        "SELECT * FROM reservation_transitions",
        "UPDATE reservation_transitions SET worker = 'x'",
        "DELETE FROM reservation_transitions",
        "TRUNCATE reservation_transitions",
        f"INSERT INTO reservation_transitions (reservation_id, from_status, to_status, worker, at) "
        f"VALUES ({NIL}, 'held', 'expired', 'w', now() - interval '1 hour')",
        "DELETE FROM dead_letters",
        "UPDATE dead_letters SET body_excerpt = 'x'",
        "UPDATE dead_letters SET recorded_at = now()",
        "SELECT body_excerpt FROM dead_letters",
        "SELECT policy FROM dead_letters",
        "UPDATE dead_letters SET note = 'x'",
        "UPDATE dead_letters SET reservation_id = NULL",
        "SELECT * FROM dead_letter_events",
        "UPDATE dead_letter_events SET detail = 'x'",
        "DELETE FROM dead_letter_events",
        "TRUNCATE dead_letter_events",
        "INSERT INTO dead_letter_events (dead_letter_id, kind, operator, db_user) "
        "SELECT id, 'assigned', 'o', 'someone-else' FROM dead_letters LIMIT 1",
        "INSERT INTO dead_letter_events (dead_letter_id, kind, operator, at) "
        "SELECT id, 'assigned', 'o', now() - interval '1 day' FROM dead_letters LIMIT 1",
        "INSERT INTO dead_letter_events (dead_letter_id, kind, operator, os_user) "
        "SELECT id, 'assigned', 'o', 'root' FROM dead_letters LIMIT 1",
        "SELECT * FROM dead_letter_replays",
        "INSERT INTO dead_letter_replays (dead_letter_id, message_id, operator, outcome) "
        "VALUES (1, 'm', 'o', 'republished')",
        "TRUNCATE delivery_crashes",
        "DELETE FROM schema_migrations",
        "DROP TABLE reservations",
        "ALTER TABLE reservation_transitions DISABLE TRIGGER reservation_transitions_append_only",
        "DROP TRIGGER reservation_transitions_no_truncate ON reservation_transitions",
        "CREATE TABLE public.intruder (id int)",
        "SET session_replication_role = replica",
        "CREATE ROLE intruder",
        # The outbox: insert (through its expiries), nothing more.
        "SELECT * FROM expiry_events",
        "SELECT message_id, traceparent FROM expiry_events",
        "UPDATE expiry_events SET lease_until = now()",
        "UPDATE expiry_events SET message_id = 'x'",
        "DELETE FROM expiry_events",
        "TRUNCATE expiry_events",
        f"INSERT INTO expiry_events (reservation_id, hold_until, expired_at, message_id, "
        f"created_at) VALUES ({NIL}, now(), now(), 'm', now() - interval '1 day')",
        f"INSERT INTO expiry_events (reservation_id, hold_until, expired_at, message_id, "
        f"lease_token) VALUES ({NIL}, now(), now(), 'm', {NIL})",
        "SELECT * FROM expiry_events_sent",
        f"INSERT INTO expiry_events_sent (id, reservation_id, message_id, expired_at, "
        f"created_at, claims, relay) VALUES (1, {NIL}, 'm', now(), now(), 1, 'r')",
        "DELETE FROM expiry_events_sent",
        "ALTER TABLE reservation_transitions DISABLE TRIGGER expiry_events_of_expiries",
    ],
    SCAN: [
        "UPDATE reservations SET status = 'expired'",
        "UPDATE reservations SET hold_until = now()",
        "DELETE FROM reservations",
        f"INSERT INTO reservations (id, hold_until) VALUES ({NIL}, now())",
        "SELECT * FROM reservation_transitions",
        f"INSERT INTO reservation_transitions (reservation_id, from_status, to_status, worker) "
        f"VALUES ({NIL}, 'held', 'expired', 'w')",
        "SELECT * FROM dead_letters",
        "UPDATE dead_letters SET status = 'replayed'",
        "DELETE FROM dead_letters",
        "SELECT * FROM dead_letter_replays",
        "SELECT * FROM delivery_crashes",
        "INSERT INTO delivery_crashes (message_id) VALUES ('m')",
        "DELETE FROM publish_leases",
        "TRUNCATE publish_leases",
        f"UPDATE publish_leases SET reservation_id = {NIL}",
        "DROP TABLE publish_leases",
        "ALTER TABLE publish_leases DISABLE TRIGGER ALL",
        "CREATE TABLE public.intruder (id int)",
        "SELECT * FROM expiry_events",
        "SELECT count(*) FROM expiry_events",
        f"INSERT INTO expiry_events (reservation_id, hold_until, expired_at, message_id) "
        f"VALUES ({NIL}, now(), now(), 'm')",
        "SELECT * FROM expiry_events_sent",
    ],
    OPERATOR: [
        "UPDATE reservations SET status = 'expired'",
        "UPDATE reservations SET updated_at = now()",
        "DELETE FROM reservations",
        "SELECT * FROM reservations FOR UPDATE",
        f"INSERT INTO reservation_transitions (reservation_id, from_status, to_status, worker) "
        f"VALUES ({NIL}, 'held', 'expired', 'w')",
        "UPDATE reservation_transitions SET worker = 'x'",
        "DELETE FROM reservation_transitions",
        "TRUNCATE reservation_transitions",
        "DELETE FROM dead_letters",
        "UPDATE dead_letters SET reason = 'x'",
        "UPDATE dead_letters SET times_dead = 0",
        "INSERT INTO dead_letters (message_id, error_class, give_up, reason, attempts, first_seen, "
        "last_seen, worker) VALUES ('m', 'c', 'g', 'r', 1, now(), now(), 'w')",
        "UPDATE dead_letter_replays SET outcome = 'x'",
        "INSERT INTO dead_letter_replays (dead_letter_id, message_id, operator, outcome, db_user) "
        "SELECT id, message_id, 'o', 'refused', 'someone-else' FROM dead_letters LIMIT 1",
        "INSERT INTO dead_letter_replays (dead_letter_id, message_id, operator, outcome, at) "
        "SELECT id, message_id, 'o', 'refused', now() - interval '1 day' FROM dead_letters "
        "LIMIT 1",
        "DELETE FROM dead_letter_replays",
        "TRUNCATE dead_letter_replays",
        "UPDATE publish_leases SET lease_until = now()",
        "SELECT * FROM delivery_crashes",
        "DROP TABLE dead_letters",
        "ALTER TABLE dead_letter_replays DISABLE TRIGGER dead_letter_replays_append_only",
        "CREATE TABLE public.intruder (id int)",
        "UPDATE console_logins SET outcome = 'ok'",
        "DELETE FROM console_logins",
        "TRUNCATE console_logins",
        "INSERT INTO console_logins (name, known, client_host, device, outcome, at) "
        "VALUES ('a', true, 'h', false, 'ok', now() - interval '1 day')",
        "DELETE FROM console_sessions",
        "UPDATE console_sessions SET operator = 'mallory'",
        "UPDATE console_sessions SET started_at = now()",
        "UPDATE console_sessions SET token = token",
        f"INSERT INTO expiry_events (reservation_id, hold_until, expired_at, message_id) "
        f"VALUES ({NIL}, now(), now(), 'm')",
        "UPDATE expiry_events SET lease_until = now()",
        "DELETE FROM expiry_events",
        "TRUNCATE expiry_events",
        f"INSERT INTO expiry_events_sent (id, reservation_id, message_id, expired_at, "
        f"created_at, claims, relay) VALUES (1, {NIL}, 'm', now(), now(), 1, 'r')",
        "DELETE FROM expiry_events_sent",
    ],
    # The deliverer: its endpoints' shared state, its deliveries, the dead letters it
    # records; nothing else.
    DELIVER: [
        "SELECT * FROM reservations",
        "UPDATE reservations SET status = 'expired'",
        "SELECT * FROM reservation_transitions",
        "SELECT * FROM expiry_events",
        "SELECT * FROM expiry_events_sent",
        "SELECT * FROM publish_leases",
        "SELECT * FROM dead_letter_events",
        "SELECT * FROM dead_letter_replays",
        "SELECT note FROM dead_letters",
        "UPDATE dead_letters SET note = 'x'",
        "DELETE FROM dead_letters",
        "SELECT * FROM console_sessions",
        "UPDATE webhook_endpoints SET name = 'x'",
        "UPDATE webhook_endpoints SET registered_at = now()",
        f"INSERT INTO webhook_deliveries (endpoint, message_id, reservation_id, hold_until, "
        f"expired_at) VALUES ('e', 'm', {NIL}, now(), now())",
        "UPDATE webhook_deliveries SET message_id = 'x'",
        "UPDATE webhook_deliveries SET endpoint = 'x'",
        f"UPDATE webhook_deliveries SET reservation_id = {NIL}",
        "UPDATE webhook_deliveries SET created_at = now()",  # since: --enable may move it
        "TRUNCATE webhook_deliveries",
        "INSERT INTO history_requests (kind, target, since, until, events, outcome, operator, "
        "os_user, host) VALUES ('backfill', 'e', now(), now(), 0, 'done', 'o', 'u', 'h')",
        "DELETE FROM schema_migrations",
        "CREATE TABLE public.intruder (id int)",
    ],
    # The relay: claim, read and mark the outbox, record what it sent; nothing else.
    RELAY: [
        "SELECT * FROM reservations",
        "UPDATE reservations SET status = 'expired'",
        "DELETE FROM reservations",
        f"INSERT INTO reservations (id, hold_until) VALUES ({NIL}, now())",
        "SELECT * FROM reservation_transitions",
        f"INSERT INTO reservation_transitions (reservation_id, from_status, to_status, worker) "
        f"VALUES ({NIL}, 'held', 'expired', 'w')",
        "SELECT * FROM publish_leases",
        "SELECT * FROM dead_letters",
        "SELECT * FROM parked_holds",
        "SELECT * FROM delivery_crashes",
        "SELECT * FROM console_sessions",
        f"INSERT INTO expiry_events (reservation_id, hold_until, expired_at, message_id) "
        f"VALUES ({NIL}, now(), now(), 'm')",
        "UPDATE expiry_events SET message_id = 'x'",
        "UPDATE expiry_events SET traceparent = NULL",
        f"UPDATE expiry_events SET reservation_id = {NIL}",
        "UPDATE expiry_events SET created_at = now()",
        "TRUNCATE expiry_events",
        "SELECT * FROM expiry_events_sent",
        "UPDATE expiry_events_sent SET relay = 'x'",
        "DELETE FROM expiry_events_sent",
        "TRUNCATE expiry_events_sent",
        "DELETE FROM schema_migrations",
        "DROP TABLE expiry_events",
        "ALTER TABLE expiry_events DISABLE TRIGGER ALL",
        "CREATE TABLE public.intruder (id int)",
    ],
}


@pytest.mark.parametrize("role", EVERY_ROLE)
async def test_each_role_is_refused_everything_its_job_does_not_need(
    stack: support.Stack, role: str
) -> None:
    """Every statement outside a role's job is refused with InsufficientPrivilegeError."""
    allowed: list[str] = []
    async with connected_as(stack.database_url, role) as conn:
        for statement in CANNOT[role]:
            transaction = conn.transaction()
            await transaction.start()
            try:
                await conn.execute(statement)
                allowed.append(statement)
            except asyncpg.InsufficientPrivilegeError:
                pass
            finally:
                await transaction.rollback()
    assert allowed == []


@pytest.mark.parametrize(
    "statement",
    [
        "TRUNCATE reservation_transitions",
        "TRUNCATE dead_letter_replays",
        "TRUNCATE reservations CASCADE",
        "TRUNCATE dead_letter_events",
        "TRUNCATE console_logins",
        "TRUNCATE retention_actions",
    ],
)
async def test_nobody_truncates_the_audit_tables_not_even_their_owner(
    stack: support.Stack, statement: str
) -> None:
    """The owner (here a superuser) is refused TRUNCATE of an audit table, cascading or not."""
    await support.insert_holds(stack.database_url, 1)
    async with support.pg_connection(stack.database_url) as conn:
        with pytest.raises(asyncpg.RaiseError, match="is append-only"):
            await conn.execute(statement)


GRANTS_OF = """
SELECT grantee::regrole::text AS role, c.relname AS object, NULL AS col, a.privilege_type AS p
  FROM pg_class c, aclexplode(c.relacl) a
 WHERE c.relnamespace = 'public'::regnamespace AND a.grantee <> c.relowner
UNION ALL
SELECT grantee::regrole::text, c.relname, att.attname, a.privilege_type
  FROM pg_class c JOIN pg_attribute att ON att.attrelid = c.oid, aclexplode(att.attacl) a
 WHERE c.relnamespace = 'public'::regnamespace AND a.grantee <> c.relowner
"""
EVERY_COLUMN = "*"
GRANTS = {
    (CONSUMER, "reservations", "SELECT"): EVERY_COLUMN,
    (CONSUMER, "reservations", "UPDATE"): "status updated_at",
    (CONSUMER, "reservation_transitions", "INSERT"): (
        "reservation_id from_status to_status message_id attempt worker traceparent"
    ),
    # The outbox: its expiries write the events (the trigger runs as the writer), and its
    # gauges read the backlog's size and age; nothing of an event's payload.
    (CONSUMER, "expiry_events", "INSERT"): "reservation_id hold_until expired_at message_id "
    "traceparent",
    (CONSUMER, "expiry_events", "SELECT"): "created_at lease_until",
    (RELAY, "expiry_events", "SELECT"): EVERY_COLUMN,
    (RELAY, "expiry_events", "DELETE"): EVERY_COLUMN,
    (RELAY, "expiry_events", "UPDATE"): "lease_until lease_token claims",
    (RELAY, "expiry_events_sent", "INSERT"): EVERY_COLUMN,
    (RELAY, "schema_migrations", "SELECT"): EVERY_COLUMN,
    (OPERATOR, "expiry_events", "SELECT"): EVERY_COLUMN,
    # HTTP delivery: an expiry's event writes its deliveries (the trigger runs as the
    # writer); the deliverer shares its endpoints' state, claims and settles deliveries,
    # records dead letters as the consumers' recorder does; an operator revives them.
    (CONSUMER, "webhook_endpoints", "SELECT"): "name",
    (CONSUMER, "webhook_deliveries", "INSERT"): (
        "endpoint message_id reservation_id hold_until expired_at traceparent"
    ),
    (DELIVER, "webhook_endpoints", "SELECT"): EVERY_COLUMN,
    (DELIVER, "webhook_endpoints", "DELETE"): EVERY_COLUMN,
    (DELIVER, "webhook_endpoints", "INSERT"): "name",
    (DELIVER, "webhook_endpoints", "UPDATE"): "seen_at tokens tokens_at failures paused_until "
    "probing_until pauses held_until disabled_at",
    (DELIVER, "webhook_deliveries", "SELECT"): EVERY_COLUMN,
    (DELIVER, "webhook_deliveries", "DELETE"): EVERY_COLUMN,
    (DELIVER, "webhook_deliveries", "UPDATE"): (
        "next_at attempts lease_until lease_token last_status last_error dead since"
    ),
    (DELIVER, "dead_letters", "SELECT"): (
        "id message_id status times_dead error_class give_up reason attempts first_seen "
        "last_seen worker owner"
    ),
    (DELIVER, "dead_letters", "INSERT"): (
        "message_id reservation_id hold_until error_class give_up reason attempts first_seen "
        "last_seen worker body_excerpt policy"
    ),
    (DELIVER, "dead_letters", "UPDATE"): (
        "times_dead status error_class give_up reason attempts first_seen last_seen worker "
        "policy updated_at owner"
    ),
    (DELIVER, "dead_letter_events", "INSERT"): "dead_letter_id kind operator detail",
    (DELIVER, "schema_migrations", "SELECT"): EVERY_COLUMN,
    # History (an operator's acts): audited; a backfill queues deliveries.
    (OPERATOR, "webhook_deliveries", "INSERT"): (
        "endpoint message_id reservation_id hold_until expired_at origin"
    ),
    (OPERATOR, "history_requests", "INSERT"): (
        "kind target since until events outcome operator os_user host"
    ),
    (OPERATOR, "history_requests", "SELECT"): EVERY_COLUMN,
    (OPERATOR, "webhook_endpoints", "SELECT"): EVERY_COLUMN,
    (OPERATOR, "webhook_deliveries", "SELECT"): EVERY_COLUMN,
    (OPERATOR, "webhook_deliveries", "UPDATE"): (
        "since next_at attempts lease_until lease_token dead origin"
    ),
    (OPERATOR, "webhook_attempts", "SELECT"): EVERY_COLUMN,
    (DELIVER, "webhook_attempts", "INSERT"): (
        "endpoint message_id attempt kind status error_class duration_ms deliverer"
    ),
    (OPERATOR, "expiry_events_sent", "SELECT"): EVERY_COLUMN,
    (CONSUMER, "delivery_crashes", "SELECT"): EVERY_COLUMN,
    (CONSUMER, "delivery_crashes", "INSERT"): EVERY_COLUMN,
    (CONSUMER, "delivery_crashes", "DELETE"): EVERY_COLUMN,
    (CONSUMER, "delivery_crashes", "UPDATE"): "handled last_at",
    (CONSUMER, "dead_letters", "INSERT"): (
        "message_id reservation_id hold_until error_class give_up reason attempts first_seen "
        "last_seen worker body_excerpt policy"
    ),
    (CONSUMER, "dead_letters", "SELECT"): (
        "message_id status times_dead error_class give_up reason attempts first_seen last_seen "
        "worker id owner"
    ),
    (CONSUMER, "dead_letters", "UPDATE"): (
        "status times_dead error_class give_up reason attempts first_seen last_seen worker "
        "updated_at policy owner"
    ),
    (CONSUMER, "dead_letter_events", "INSERT"): "dead_letter_id kind operator detail",
    (CONSUMER, "publish_leases", "SELECT"): "reservation_id last_published",
    (CONSUMER, "parked_holds", "SELECT"): "reservation_id",
    (SCAN, "reservations", "SELECT"): EVERY_COLUMN,
    (SCAN, "reservations", "UPDATE"): "updated_at",
    (SCAN, "publish_leases", "SELECT"): EVERY_COLUMN,
    (SCAN, "publish_leases", "INSERT"): EVERY_COLUMN,
    (SCAN, "publish_leases", "UPDATE"): (
        "message_id lease_until first_published last_published publish_count"
    ),
    (SCAN, "parked_holds", "SELECT"): "reservation_id",
    (SCAN, "scan_passes", "SELECT"): EVERY_COLUMN,
    (SCAN, "scan_passes", "INSERT"): EVERY_COLUMN,
    (SCAN, "scan_passes", "UPDATE"): "started_at finished_at result published unconfirmed",
    (OPERATOR, "reservations", "SELECT"): EVERY_COLUMN,
    (OPERATOR, "reservation_transitions", "SELECT"): EVERY_COLUMN,
    (OPERATOR, "publish_leases", "SELECT"): EVERY_COLUMN,
    (OPERATOR, "dead_letters", "SELECT"): EVERY_COLUMN,
    (OPERATOR, "dead_letters", "UPDATE"): "status updated_at owner note",
    (OPERATOR, "dead_letter_events", "SELECT"): EVERY_COLUMN,
    (OPERATOR, "dead_letter_events", "INSERT"): (
        "dead_letter_id kind operator detail os_user client_host"
    ),
    (OPERATOR, "parked_holds", "SELECT"): EVERY_COLUMN,
    (OPERATOR, "parked_holds", "INSERT"): EVERY_COLUMN,
    (OPERATOR, "parked_holds", "DELETE"): EVERY_COLUMN,
    (OPERATOR, "scan_passes", "SELECT"): EVERY_COLUMN,
    (OPERATOR, "schema_migrations", "SELECT"): EVERY_COLUMN,
    (CONSUMER, "schema_migrations", "SELECT"): EVERY_COLUMN,
    (OPERATOR, "dead_letter_replays", "SELECT"): EVERY_COLUMN,
    (OPERATOR, "dead_letter_replays", "INSERT"): (
        "dead_letter_id message_id operator outcome detail os_user client_host"
    ),
    (OPERATOR, "console_sessions", "SELECT"): EVERY_COLUMN,
    (OPERATOR, "console_sessions", "INSERT"): ("token operator credential csrf device client_host"),
    (OPERATOR, "console_sessions", "UPDATE"): "last_seen_at ended_at ended_by end_reason",
    (OPERATOR, "console_logins", "SELECT"): EVERY_COLUMN,
    (OPERATOR, "console_logins", "INSERT"): "name known client_host device outcome detail",
    # What retention did and when it last ran: the gauges of every process, status.
    **{
        (role, table, "SELECT"): EVERY_COLUMN
        for role in (CONSUMER, SCAN, OPERATOR)
        for table in ("retention_actions", "retention_runs")
    },
}


async def test_the_grants_are_exactly_the_matrix_and_public_holds_nothing(
    stack: support.Stack,
) -> None:
    """Only the runtime roles hold privileges (nothing on sequences), exactly these; they own
    nothing."""
    async with support.pg_connection(stack.database_url) as conn:
        rows = await conn.fetch(GRANTS_OF)
        owned = await conn.fetch(
            "SELECT relname FROM pg_class WHERE relowner::regrole::text = ANY($1::text[]) "
            "UNION ALL SELECT proname FROM pg_proc WHERE proowner::regrole::text = ANY($1::text[])",
            list(EVERY_ROLE),
        )
    found: dict[tuple[str, str, str], set[str]] = {}
    for row in rows:
        found.setdefault((row["role"], row["object"], row["p"]), set()).add(
            row["col"] or EVERY_COLUMN
        )
    expected = {key: set(columns.split()) for key, columns in GRANTS.items()}
    assert found == expected  # PUBLIC (role "-") and sequences appear in neither
    assert owned == []


# -- migrating ---------------------------------------------------------------------


async def test_a_second_database_migrates_and_migrates_again(endpoints: support.Endpoints) -> None:
    """Another database of the cluster migrates with the roles already there; again is a no-op."""
    async with scratch_database(endpoints) as url:
        settings = support.stack_settings(url, endpoints.amqp_url)
        assert await migrate(settings) == [m.version for m in load_migrations()]
        assert await migrate(settings) == []
        [sql] = [m.sql for m in load_migrations() if m.version == ROLES_MIGRATION]
        await admin(url, sql)  # the file itself is idempotent too
        async with connected_as(url, OPERATOR) as conn:
            assert await conn.fetchval("SELECT count(*) FROM dead_letters") == 0


async def test_a_migrate_waits_its_turn_past_the_lock_timeout(
    endpoints: support.Endpoints, caplog: pytest.LogCaptureFixture
) -> None:
    """A migrate that finds another holding the migration lock for longer than
    EXPIRY_LOCK_TIMEOUT_MS waits for it (saying so), then applies what is left."""
    caplog.set_level(logging.INFO, "service.migrate")
    async with scratch_database(endpoints) as url:
        settings = support.stack_settings(url, endpoints.amqp_url).model_copy(
            update={"lock_timeout_ms": 100}
        )
        async with support.pg_connection(url) as other:
            await other.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
            waiting = asyncio.create_task(migrate(settings))
            await asyncio.sleep(0.5)  # five lock timeouts
            assert not waiting.done()
            await other.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
            assert await waiting == [m.version for m in load_migrations()]
    assert [r.msg for r in caplog.records].count("migrate.waiting") == 1


async def test_an_owner_without_superuser_migrates_when_the_roles_exist(
    endpoints: support.Endpoints,
) -> None:
    """A plain login role that owns the database migrates it (roles pre-created) and owns it all."""
    owner = f"xr_{support.RUN_ID}_{uuid.uuid4().hex[:6]}_owner"
    await admin(endpoints.database_url, f"CREATE ROLE {owner} LOGIN")  # no CREATEROLE
    async with (
        throwaway_roles(endpoints, owner),
        scratch_database(endpoints, owner=owner) as url,
    ):
        settings = support.stack_settings(as_role(url, owner), endpoints.amqp_url)
        assert await migrate(settings) == [m.version for m in load_migrations()]
        async with support.pg_connection(url) as conn:
            owners = await conn.fetch(
                "SELECT DISTINCT relowner::regrole::text AS owner FROM pg_class "
                "WHERE relnamespace = 'public'::regnamespace"
            )
        assert [row["owner"] for row in owners] == [owner]
        async with connected_as(url, SCAN) as conn:
            assert await conn.fetchval("SELECT count(*) FROM publish_leases") == 0


async def test_a_missing_role_the_owner_may_not_create_fails_with_one_clear_line(
    endpoints: support.Endpoints, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without CREATEROLE and without the roles, migrate says to create the roles first."""
    names = renamed_roles(uuid.uuid4().hex[:6])
    owner = f"xr_{support.RUN_ID}_{uuid.uuid4().hex[:6]}_owner"
    await admin(endpoints.database_url, f"CREATE ROLE {owner} LOGIN")
    async with (
        throwaway_roles(endpoints, owner, *names.values()),
        scratch_database(endpoints, owner=owner) as url,
    ):
        settings = support.stack_settings(as_role(url, owner), endpoints.amqp_url)
        with (
            migrations_replaced(monkeypatch, migrations_with(names)),
            pytest.raises(asyncpg.InsufficientPrivilegeError) as refused,
        ):
            await migrate(settings)
        assert await applied_versions(url) == [m.version for m in before_roles()]
    [line] = str(refused.value).splitlines()
    assert f"role {names[CONSUMER]} does not exist and {owner} may not create roles" in line
    assert "first (postgres/init.sql" in line
    assert cause_chain(refused.value)[0] == f"InsufficientPrivilegeError: {line}"


async def test_two_databases_migrating_at_once_create_each_missing_role_once(
    endpoints: support.Endpoints, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A migration that waits on another's uncommitted CREATE ROLE succeeds once that commits."""
    names = renamed_roles(uuid.uuid4().hex[:6])
    sql = roles_migration(names)
    async with (
        throwaway_roles(endpoints, *names.values()),
        scratch_database(endpoints) as first_url,
        scratch_database(endpoints) as second_url,
    ):
        with migrations_replaced(monkeypatch, before_roles()):
            for url in (first_url, second_url):
                await migrate(support.stack_settings(url, endpoints.amqp_url))
        async with (
            support.pg_connection(first_url) as first,
            support.pg_connection(second_url) as second,
            support.pg_connection(endpoints.database_url) as watcher,
        ):
            leading = first.transaction()
            await leading.start()
            await first.execute(sql)  # creates the roles, not committed yet
            waiting = asyncio.create_task(_in_transaction(second, sql))
            await support.eventually(lambda: _waits_on_a_lock(watcher, second.get_server_pid()))
            await leading.commit()
            await waiting  # it created nothing, and granted the same
        for url in (first_url, second_url):
            async with connected_as(url, names[OPERATOR]) as conn:
                assert await conn.fetchval("SELECT count(*) FROM dead_letters") == 0
        async with support.pg_connection(endpoints.database_url) as conn:
            created = await conn.fetch(
                "SELECT rolname, rolcanlogin FROM pg_roles WHERE rolname = ANY($1::text[])",
                list(names.values()),
            )
        assert sorted(tuple(row) for row in created) == sorted(
            (names[role], True)
            for role in RUNTIME_ROLES  # 0005's (0014 and 0015 create the relay's, the deliverer's)
        )


async def _in_transaction(conn: asyncpg.Connection[asyncpg.Record], sql: str) -> None:
    async with conn.transaction():
        await conn.execute(sql)


async def _waits_on_a_lock(conn: asyncpg.Connection[asyncpg.Record], pid: int) -> bool:
    """Whether backend ``pid`` waits on a lock (asked outside any transaction, whose view of
    pg_stat_activity would stay frozen)."""
    waiting = await conn.fetchval(
        "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid
    )
    return bool(waiting)


async def test_init_sql_prepares_the_server_for_an_owner_without_superuser(
    endpoints: support.Endpoints, monkeypatch: pytest.MonkeyPatch
) -> None:
    """postgres/init.sql makes the roles and the database; migrate runs as the owner; a rerun
    keeps every role as it is."""
    psql = shutil.which("psql")
    if psql is None:
        support.missing("psql is not installed")
    suffix = uuid.uuid4().hex[:6]
    names = renamed_roles(suffix)
    names["expiry_owner"] = owner = f"xr_{support.RUN_ID}_{suffix}_owner"
    database = f"xr_{support.RUN_ID}_{suffix}_db"
    script = re.sub(r"\b(expiry_\w+)\b", lambda m: names.get(m.group(1), m.group(1)), INIT_SQL)
    script = re.sub(r"\bexpiry\b", database, script)
    url = support.with_database(endpoints.database_url, database)
    try:
        _run_psql(str(psql), endpoints.database_url, script)
        await admin(url, f"ALTER ROLE {names[CONSUMER]} PASSWORD 'changed-since'")
        before = await _passwords(endpoints.database_url, names)
        _run_psql(str(psql), endpoints.database_url, script)  # again: nothing changes
        assert await _passwords(endpoints.database_url, names) == before
        assert set(before) == set(names.values())  # each role has a password
        with migrations_replaced(monkeypatch, migrations_with(names)):
            await migrate(support.stack_settings(as_role(url, owner), endpoints.amqp_url))
        async with connected_as(url, names[OPERATOR]) as conn:
            assert await conn.fetchval("SELECT count(*) FROM reservations") == 0
        async with support.pg_connection(url) as conn:
            database_owner = await conn.fetchval(
                "SELECT datdba::regrole::text FROM pg_database WHERE datname = $1", database
            )
            connect = await conn.fetch(
                "SELECT grantee::regrole::text AS role, privilege_type AS p "
                "FROM pg_database, aclexplode(datacl) WHERE datname = $1 AND grantee <> datdba",
                database,
            )
        assert database_owner == owner
        assert sorted(tuple(row) for row in connect) == sorted(
            (names[role], "CONNECT") for role in EVERY_ROLE
        )  # PUBLIC may neither connect nor create temporary tables
    finally:
        await admin(
            endpoints.database_url,
            f"DROP DATABASE IF EXISTS {database} WITH (FORCE)",
            *(f"DROP ROLE IF EXISTS {name}" for name in names.values()),
        )


INIT_SQL = (REPO / "postgres" / "init.sql").read_text(encoding="utf-8")


def _run_psql(psql: str, url: str, script: str) -> None:
    """Run ``script`` with psql as the image's entrypoint does (no psqlrc, stop on error)."""
    done = subprocess.run(
        [psql, "--no-psqlrc", "--no-password", "-v", "ON_ERROR_STOP=1", "-d", url, "-f", "-"],
        input=script,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


async def _passwords(url: str, names: dict[str, str]) -> dict[str, str]:
    """Each of the roles that has a password: its stored hash."""
    async with support.pg_connection(url) as conn:
        rows = await conn.fetch(
            "SELECT rolname, rolpassword FROM pg_authid "
            "WHERE rolname = ANY($1::text[]) AND rolpassword IS NOT NULL",
            list(names.values()),
        )
    return {row["rolname"]: row["rolpassword"] for row in rows}


@pytest.mark.parametrize("role", EVERY_ROLE)
async def test_retention_refuses_a_runtime_role_and_changes_nothing(
    stack: support.Stack, role: str
) -> None:
    """Only the owner makes and drops the audit's weeks: any runtime role is refused with
    one line naming the owner, before it takes the run lock or touches a row."""
    async with support.pg_connection(stack.database_url) as owner:
        before = await owner.fetchval("SELECT count(*) FROM pg_inherits")
    async with connected_as(stack.database_url, role) as conn:
        with pytest.raises(UsageError, match=r"retention runs as the owner of the tables"):
            await housekeeping.run(conn, stack.settings, say=lambda _line: None)
    async with support.pg_connection(stack.database_url) as owner:
        assert await owner.fetchval("SELECT count(*) FROM pg_inherits") == before
        assert await owner.fetchval("SELECT count(*) FROM retention_actions") == 0
        assert await owner.fetchval("SELECT count(*) FROM retention_runs") == 0
