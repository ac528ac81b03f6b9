"""Dead letters as an operator sees them: records, list, show, audited replay."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from uuid import UUID, uuid4

import aio_pika
import pytest

from service import scan
from service.core.default_owners import DEFAULT_OPERATOR, parse_owner_rules
from service.core.domain import command_body
from service.core.recorded_policy import Policy, policy_in_force
from tests.seeding import seed_dead_letters
from tests.support import (
    Stack,
    eventually,
    pg_connection,
    publish_raw,
    queue_depth,
    run_module,
    running_consumer,
    statuses,
    transitions_per_reservation,
    wait_for_consumers,
)

pytestmark = pytest.mark.integration


OPERATORS = "alice,bob,carol"


def deadletters(stack: Stack, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m service.deadletters`` against the test's stack (alice, bob and carol
    may replay, unless ``env`` says otherwise)."""
    env = {"EXPIRY_REPLAY_OPERATORS": OPERATORS, **env}
    return run_module("service.deadletters", *args, env=stack.env(**env))


async def _records(stack: Stack) -> dict[str, dict[str, object]]:
    async with pg_connection(stack.database_url) as conn:
        rows = await conn.fetch("SELECT * FROM dead_letters")
    return {row["message_id"]: dict(row) for row in rows}


async def _record_count_is(stack: Stack, count: int) -> bool:
    return len(await _records(stack)) == count


async def _dead_letter_one_exhausted_and_one_poison(stack: Stack) -> UUID:
    """A hold whose retries run out while the database is away, and a poison body."""
    [rid] = await seed_dead_letters(stack)
    return rid


async def _depth_is(stack: Stack, queue: str, depth: int) -> bool:
    return await queue_depth(stack.amqp_url, queue) == depth


async def test_dead_letters_are_recorded_listed_shown_and_replayed(stack: Stack) -> None:
    """Poison and exhausted commands get records; a replay after the fix expires the hold once."""
    rid = await _dead_letter_one_exhausted_and_one_poison(stack)
    records = await _records(stack)
    poison = records["junk-1"]
    assert (poison["error_class"], poison["give_up"], poison["reservation_id"]) == (
        "poison.not-json",
        "permanent",
        None,
    )
    assert "html" not in str(poison["body_excerpt"])  # letters are masked
    [exhausted] = [r for r in records.values() if r["reservation_id"] == rid]
    assert (exhausted["error_class"], exhausted["give_up"], exhausted["attempts"]) == (
        "db.unavailable",
        "attempts-exhausted",
        2,
    )

    listing = deadletters(stack, "list")
    assert listing.returncode == 0, listing.stderr
    assert "poison.not-json" in listing.stdout
    assert "db.unavailable" in listing.stdout
    only_poison = json.loads(
        deadletters(stack, "list", "--json", "--error-class", "poison.not-json").stdout
    )
    assert [r["message_id"] for r in only_poison] == ["junk-1"]

    refused = deadletters(stack, "replay", str(exhausted["id"]))
    assert refused.returncode == 2
    assert "--operator" in refused.stderr

    dry = deadletters(stack, "replay", str(exhausted["id"]), "--operator", "alice", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would-republish" in dry.stdout
    assert "it will expire" in dry.stdout
    assert await queue_depth(stack.amqp_url, "expirations.dead") == 2

    async with running_consumer(stack.settings) as task:  # the cause is fixed: database back
        await wait_for_consumers(stack.amqp_url, 1, task)
        replay = deadletters(stack, "replay", str(exhausted["id"]), "--operator", "alice")
        assert replay.returncode == 0, replay.stdout + replay.stderr
        assert "republished" in replay.stdout
        await eventually(lambda: _expired(stack, 1))
    assert await transitions_per_reservation(stack.database_url) == {rid: 1}
    assert await queue_depth(stack.amqp_url, "expirations.dead") == 1  # the poison stays
    async with pg_connection(stack.database_url) as conn:
        audit = await conn.fetch("SELECT operator, outcome FROM dead_letter_replays")
        status = await conn.fetchval(
            "SELECT status FROM dead_letters WHERE id = $1", exhausted["id"]
        )
    assert [(a["operator"], a["outcome"]) for a in audit] == [
        ("", "refused"),  # the replay without --operator
        ("alice", "republished"),
    ]
    assert status == "replayed"

    shown = deadletters(stack, "show", str(exhausted["id"]))
    assert shown.returncode == 0
    assert "held" in shown.stdout
    assert "expired" in shown.stdout
    assert "alice" in shown.stdout

    again = deadletters(stack, "replay", str(exhausted["id"]), "--operator", "alice")
    assert again.returncode == 2  # already replayed: refused, nothing republished
    assert await transitions_per_reservation(stack.database_url) == {rid: 1}


async def _expired(stack: Stack, count: int) -> bool:
    return (await statuses(stack.database_url)).get("expired", 0) == count


async def test_replaying_a_hold_consumed_meanwhile_is_harmless(stack: Stack) -> None:
    """The support side consumed the hold after it was dead-lettered: the replay is a no-op."""
    rid = await _dead_letter_one_exhausted_and_one_poison(stack)
    async with pg_connection(stack.database_url) as conn:
        await conn.execute("UPDATE reservations SET status = 'consumed' WHERE id = $1", rid)
    async with running_consumer(stack.settings) as task:
        await wait_for_consumers(stack.amqp_url, 1, task)
        replay = deadletters(stack, "replay", "--all", "--yes", "--operator", "bob")
        assert replay.returncode == 0, replay.stdout + replay.stderr
        assert "harmless no-op" in replay.stdout
        await eventually(lambda: _depth_is(stack, "expirations", 0))
        # The poison went round again and is dead once more: still one record, counted twice.
        await eventually(lambda: _times_dead(stack, "junk-1", 2), timeout=30)
    assert await statuses(stack.database_url) == {"consumed": 1}
    assert await transitions_per_reservation(stack.database_url) == {}


async def _times_dead(stack: Stack, message_id: str, times: int) -> bool:
    record = (await _records(stack)).get(message_id)
    return record is not None and record["times_dead"] == times and record["status"] == "dead"


async def test_replay_rebuilds_a_command_missing_from_the_dead_queue(stack: Stack) -> None:
    """If the dead queue lost the message (purged), the record still lets it be replayed."""
    rid = await _dead_letter_one_exhausted_and_one_poison(stack)
    connection = await aio_pika.connect(stack.amqp_url)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue("expirations.dead", passive=True)
        await queue.purge()
    async with running_consumer(stack.settings) as task:
        await wait_for_consumers(stack.amqp_url, 1, task)
        replay = deadletters(
            stack,
            "replay",
            "--all",
            "--yes",
            "--error-class",
            "db.unavailable",
            "--operator",
            "carol",
        )
        assert replay.returncode == 0, replay.stdout + replay.stderr
        assert "rebuilt from the record" in replay.stdout
        await eventually(lambda: _expired(stack, 1))
    assert await transitions_per_reservation(stack.database_url) == {rid: 1}


async def test_only_a_named_operator_replays_and_every_refusal_is_audited(stack: Stack) -> None:
    """An operator not in EXPIRY_REPLAY_OPERATORS, or none configured, or --all without --yes
    off a terminal: refused (exit 2), nothing republished, each refusal audited with the
    database user, the OS user and the host, like the replay that is then allowed."""
    await _dead_letter_one_exhausted_and_one_poison(stack)
    stranger = deadletters(stack, "replay", "junk-1", "--operator", "mallory")
    assert stranger.returncode == 2
    assert "'mallory' may not replay" in stranger.stderr
    nobody = deadletters(
        stack, "replay", "junk-1", "--operator", "alice", EXPIRY_REPLAY_OPERATORS=""
    )
    assert nobody.returncode == 2
    assert "nobody may replay" in nobody.stderr
    unconfirmed = deadletters(stack, "replay", "--all", "--operator", "alice")
    assert unconfirmed.returncode == 2
    assert "--yes" in unconfirmed.stderr
    assert await queue_depth(stack.amqp_url, "expirations.dead") == 2
    allowed = deadletters(stack, "replay", "junk-1", "--operator", "alice")
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    async with pg_connection(stack.database_url) as conn:
        audit = await conn.fetch(
            "SELECT operator, outcome, db_user, os_user, client_host FROM dead_letter_replays "
            "ORDER BY id"
        )
    outcomes = [(a["operator"], a["outcome"]) for a in audit]
    assert outcomes == [
        ("mallory", "refused"),
        ("alice", "refused"),
        ("alice", "refused"),
        ("alice", "refused"),  # --all selected both dead letters
        ("alice", "republished"),
    ]
    assert {a["db_user"] for a in audit} == {"postgres"}
    assert all(a["os_user"] and a["client_host"] for a in audit)
    shown = deadletters(stack, "show", "junk-1")
    assert "mallory" in shown.stdout
    assert "refused" in shown.stdout


async def test_a_closed_dead_letter_parks_its_hold_until_it_is_reopened(stack: Stack) -> None:
    """Closed without a replay: audited, its hold parked (the scan leaves it alone even
    with its lease lapsed, status counts it apart, verify accepts it); assigned as a group;
    reopened: unparked, published by the next scan, expired once. Only a replay operator
    may close or reopen."""
    rid = await _dead_letter_one_exhausted_and_one_poison(stack)
    records = await _records(stack)
    [exhausted] = [r for r in records.values() if r["reservation_id"] == rid]
    record_id = str(exhausted["id"])
    async with pg_connection(stack.database_url) as conn:
        await conn.execute("UPDATE publish_leases SET lease_until = now()")  # lapsed

    refused = deadletters(stack, "close", record_id, "--text", "x", "--operator", "mallory")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "may not close" in refused.stderr
    closed = deadletters(
        stack, "close", record_id, "--text", "customer cancelled", "--operator", "bob"
    )
    assert closed.returncode == 0, closed.stdout + closed.stderr
    assert "close: 1 selected, 1 done" in closed.stdout
    async with pg_connection(stack.database_url) as conn:
        status = await conn.fetchval(
            "SELECT status FROM dead_letters WHERE id = $1", int(record_id)
        )
        parked = await conn.fetchval(
            "SELECT count(*) FROM parked_holds WHERE reservation_id = $1", rid
        )
    assert (status, parked) == ("closed", 1)

    await scan.scan_once(stack.settings)
    assert await queue_depth(stack.amqp_url, "expirations") == 0  # parked: not published
    screen = json.loads(run_module("service.status", "--json", env=stack.env()).stdout)
    assert (screen["parked_holds"], screen["backlog"]["total"]) == (1, 0)
    assert run_module("service.verify", env=stack.env()).returncode == 0

    grouped = deadletters(
        stack, "assign", "--all", "--error-class", "db.unavailable", "--text", "team-db",
        "--operator", "alice", "--yes",
    )  # fmt: skip
    assert grouped.returncode == 0, grouped.stdout + grouped.stderr
    reopened = deadletters(
        stack, "reopen", record_id, "--text", "the customer came back", "--operator", "carol"
    )
    assert reopened.returncode == 0, reopened.stdout + reopened.stderr
    await scan.scan_once(stack.settings)
    assert await queue_depth(stack.amqp_url, "expirations") == 1  # unparked: published
    async with running_consumer(stack.settings) as task:
        await wait_for_consumers(stack.amqp_url, 1, task)
        await eventually(lambda: _status_of(stack, rid, "expired"), timeout=30)
    assert (await transitions_per_reservation(stack.database_url))[rid] == 1

    shown = json.loads(deadletters(stack, "show", record_id, "--json").stdout)
    assert shown["owner"] == "team-db"
    events = [(e["kind"], e["operator"], e["detail"]) for e in shown["events"]]
    assert events == [
        ("closed", "bob", "customer cancelled"),
        ("assigned", "alice", "team-db"),
        ("reopened", "carol", "the customer came back"),
    ]
    assert all(e["db_user"] and e["at"] for e in shown["events"])


async def _status_of(stack: Stack, rid: UUID, status: str) -> bool:
    async with pg_connection(stack.database_url) as conn:
        found = await conn.fetchval("SELECT status FROM reservations WHERE id = $1", rid)
    return bool(found == status)


async def _events(stack: Stack, record_id: object) -> list[tuple[str, str, str, str]]:
    async with pg_connection(stack.database_url) as conn:
        rows = await conn.fetch(
            "SELECT kind, operator, detail, db_user FROM dead_letter_events "
            "WHERE dead_letter_id = $1 ORDER BY id",
            record_id,
        )
    return [(row["kind"], row["operator"], row["detail"], row["db_user"]) for row in rows]


async def test_the_recorder_gives_a_default_owner_audited_and_keeps_its_policy(
    stack: Stack,
) -> None:
    """A new dead letter gets the owner of the first pattern its class matches (an audited
    assignment) and the recording consumer's policy; one no pattern matches stays unowned;
    an operator's owner survives the message being dead-lettered again."""
    settings = stack.settings.model_copy(
        update={
            "dead_letter_owners": parse_owner_rules("db.*=team-db,poison.*=team-producers"),
            "max_attempts": 7,
            "retry_delays": (1,),  # a tier the stack declared
        }
    )
    unknown, deadline = uuid4(), datetime(2020, 1, 1, tzinfo=UTC)
    poison = [b"<html>not a command</html>"]
    async with running_consumer(settings) as task:
        await wait_for_consumers(stack.amqp_url, 1, task)
        await publish_raw(stack.amqp_url, poison, message_ids=["junk-owned"])
        await publish_raw(
            stack.amqp_url, [command_body(unknown, deadline)], message_ids=["unknown-hold"]
        )
        await eventually(lambda: _record_count_is(stack, 2))
        records = await _records(stack)
        junk, stray = records["junk-owned"], records["unknown-hold"]
        assert (junk["error_class"], junk["owner"]) == ("poison.not-json", "team-producers")
        assert (stray["error_class"], stray["owner"]) == ("unknown-reservation", None)
        expected = policy_in_force(settings)
        assert (expected.max_attempts, expected.delays) == (7, (1,))
        for record in (junk, stray):
            assert Policy.from_json(record["policy"]) == expected
        default = (
            "assigned",
            DEFAULT_OPERATOR,
            "team-producers (error class matched poison.*)",
            "postgres",
        )
        assert await _events(stack, junk["id"]) == [default]
        assert await _events(stack, stray["id"]) == []

        assigned = deadletters(
            stack, "assign", str(junk["id"]), "--text", "carol-desk", "--operator", "carol"
        )
        assert assigned.returncode == 0, assigned.stdout + assigned.stderr
        await publish_raw(stack.amqp_url, poison, message_ids=["junk-owned"])  # dead again
        await eventually(lambda: _times_dead(stack, "junk-owned", 2))
    again = (await _records(stack))["junk-owned"]
    assert again["owner"] == "carol-desk"
    assert [event[:3] for event in await _events(stack, junk["id"])] == [
        default[:3],
        ("assigned", "carol", "carol-desk"),
    ]


INSERT_COMMAND_RECORD = """
INSERT INTO dead_letters (message_id, reservation_id, hold_until, error_class, give_up, reason,
                          attempts, first_seen, last_seen, worker)
VALUES ($1, $2, now(), 'db.unavailable', 'attempts-exhausted', 'r', 2, now(), now(), 'w')
RETURNING id
"""


async def test_a_replay_without_an_operator_is_refused_and_audited_as_unnamed(
    stack: Stack,
) -> None:
    """No --operator: refused with one line (exit 2), nothing republished, and the refusal
    audited on each dead letter it selected: the operator recorded empty (``show`` says
    "(none given)"), the database user, the OS user and the host saying who ran it."""
    async with pg_connection(stack.database_url) as conn:
        first = await conn.fetchval(INSERT_COMMAND_RECORD, "m-1", uuid4())
        second = await conn.fetchval(INSERT_COMMAND_RECORD, "m-2", uuid4())
    for argv in (["replay", str(first)], ["replay", "--all", "--yes"], ["replay", "m-9"]):
        refused = deadletters(stack, *argv)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        said = [line for line in refused.stderr.splitlines() if not line.startswith("{")]
        assert len(said) == 1, refused.stderr  # one line (and the JSON log's warning)
        assert "needs --operator NAME" in said[0]
    assert await queue_depth(stack.amqp_url, "expirations") == 0
    async with pg_connection(stack.database_url) as conn:
        audit = await conn.fetch(
            "SELECT dead_letter_id, operator, outcome, detail, db_user, os_user, client_host "
            "FROM dead_letter_replays ORDER BY id"
        )
        still = await conn.fetchval("SELECT count(*) FROM dead_letters WHERE status = 'dead'")
    # One row for the named one, one for each of the group (m-9 names none: nothing to audit).
    assert sorted(a["dead_letter_id"] for a in audit) == sorted([first, first, second])
    assert {(a["operator"], a["outcome"]) for a in audit} == {("", "refused")}
    assert all("--operator" in a["detail"] for a in audit)
    assert all(a["db_user"] == "postgres" and a["os_user"] and a["client_host"] for a in audit)
    assert still == 2
    shown = deadletters(stack, "show", str(first))
    assert "(none given)" in shown.stdout, shown.stdout
