"""A confirmation acts on exactly what its dry run showed, no more: through the real
database and broker, with the command line's and the console's own code."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any
from uuid import uuid4

import aio_pika
import pytest

from service.adapters import postgres
from service.adapters.postgres import ownership
from service.core import recorded_policy
from service.ops import plans
from tests.seeding import seed_dead_letters
from tests.support import (
    Stack,
    as_role,
    drain_queue,
    pg_connection,
    queue_depth,
    run_module,
)

pytestmark = pytest.mark.integration

ACTOR = postgres.Actor("alice", "root", "test-host")
INSERT_RECORD = """
INSERT INTO dead_letters (message_id, error_class, give_up, reason, attempts, first_seen,
                          last_seen, worker, status)
VALUES ($1, $2, 'attempts-exhausted', 'r', 2, now(), now(), 'w', $3)
RETURNING id
"""


async def _record(conn: Any, message_id: str, error_class: str = "db.unavailable") -> int:
    record_id: int = await conn.fetchval(INSERT_RECORD, message_id, error_class, "dead")
    return record_id


def deadletters(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m service.deadletters`` against the stack; alice and bob may replay and close."""
    env = stack.env(EXPIRY_REPLAY_OPERATORS="alice,bob")
    return run_module("service.deadletters", *args, env=env)


async def test_a_confirmed_plan_acts_on_the_listed_dead_letters_only_and_only_once(
    stack: Stack,
) -> None:
    """A group's plan of three: one changes (an owner given) and one newcomer arrives
    before the confirmation, which claims the two unchanged ones and names the other two;
    confirming the same plan again claims nothing."""
    async with pg_connection(stack.database_url) as conn:
        ids = [await _record(conn, f"m-{n}") for n in range(3)]
        other = await _record(conn, "poison", "poison.not-json")
        group = plans.Selection(group=plans.Group(error_class="db.unavailable"))
        planned, rows = await plans.plan(conn, "replay", group)
        assert sorted(item.id for item in planned.items) == ids
        assert {row["id"] for row in rows} == set(ids)

        await ownership.assign(conn, ids[1], "team-db", ACTOR)  # a change since the dry run
        newcomer = await _record(conn, "m-new")
        confirmed = await plans.confirm(conn, planned)
        assert sorted(row["id"] for row in confirmed.rows) == [ids[0], ids[2]]
        why = {left.id: left.why for left in confirmed.left_out}
        assert set(why) == {ids[1], newcomer}
        assert why[ids[1]] == "changed since the dry run: owner set to team-db (by alice)"
        assert "not in the dry run" in why[newcomer]
        assert other not in why

        again = await plans.confirm(conn, planned)
        assert again.rows == []
        assert {left.id for left in again.left_out} == {*ids, newcomer}


async def test_named_dead_letters_are_planned_as_named_or_refused(stack: Stack) -> None:
    """Record ids and message ids select those; one that is not there or not in a state to
    act on is refused, as a single one always was."""
    async with pg_connection(stack.database_url) as conn:
        first = await _record(conn, "m-1")
        await _record(conn, "m-2")
        planned, _rows = await plans.plan(conn, "close", plans.Selection(keys=(str(first), "m-2")))
        assert len(planned.items) == 2
        with pytest.raises(Exception, match="no dead letter 'm-3'"):
            await plans.plan(conn, "close", plans.Selection(keys=("m-3",)))
        with pytest.raises(Exception, match="is dead; nothing to reopen"):
            await plans.plan(conn, "reopen", plans.Selection(keys=(str(first),)))


async def test_the_command_line_speaks_numbers_filters_groups_and_tidies_the_dead_queue(
    stack: Stack,
) -> None:
    """``list --json`` keeps numbers numbers; ``--verbose`` goes after a subcommand too;
    ``replay --all --give-up`` filters; a group's filters without ``--all`` are refused;
    closing takes the closed dead letters' messages off expirations.dead; ``tidy`` takes
    the copies a close left behind (the broker was away) and keeps the open ones."""
    await seed_dead_letters(stack, exhausted=2, poison=1)
    listed = deadletters(stack, "list", "--json", "--verbose")
    assert listed.returncode == 0, listed.stderr
    records = json.loads(listed.stdout)
    assert all(isinstance(r["id"], int) and isinstance(r["attempts"], int) for r in records)
    assert all(isinstance(r["times_dead"], int) for r in records)

    dry = deadletters(
        stack, "replay", "--all", "--give-up", "permanent", "--dry-run", "--json",
        "--operator", "alice",
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert [p["message_id"] for p in json.loads(dry.stdout)["plan"]] == ["junk-1"]
    no_all = deadletters(stack, "replay", "junk-1", "--give-up", "permanent", "--operator", "alice")
    assert no_all.returncode == 2
    assert "add --all" in no_all.stderr

    closed = deadletters(
        stack, "close", "--all", "--error-class", "db.unavailable", "--text", "won't",
        "--operator", "alice", "--yes",
    )  # fmt: skip
    assert closed.returncode == 0, closed.stdout + closed.stderr
    assert "took 2 of their message(s) off expirations.dead" in closed.stdout
    assert await queue_depth(stack.amqp_url, "expirations.dead") == 1  # the open poison

    # A copy of a closed dead letter left behind (as when the broker was away at the close).
    [poison] = await drain_queue(stack.amqp_url, "expirations.dead")
    await _publish_back(stack, poison)
    async with pg_connection(stack.database_url) as conn:
        await conn.execute("UPDATE dead_letters SET status = 'closed' WHERE message_id = 'junk-1'")
    dry_tidy = deadletters(stack, "tidy", "--dry-run", "--operator", "alice")
    assert "would remove 1 copy" in dry_tidy.stdout, dry_tidy.stdout + dry_tidy.stderr
    assert await queue_depth(stack.amqp_url, "expirations.dead") == 1
    tidied = deadletters(stack, "tidy", "--operator", "alice")
    assert tidied.returncode == 0, tidied.stdout + tidied.stderr
    assert "removed 1 copy" in tidied.stdout
    assert await queue_depth(stack.amqp_url, "expirations.dead") == 0


async def _publish_back(stack: Stack, message: aio_pika.abc.AbstractIncomingMessage) -> None:
    connection = await aio_pika.connect(stack.amqp_url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange("expirations.dead")
        copy = aio_pika.Message(
            message.body, headers=message.headers, message_id=message.message_id
        )
        await exchange.publish(copy, "expirations.dead")


async def test_the_dry_run_and_show_say_what_todays_retry_policy_changes(stack: Stack) -> None:
    """A dead letter recorded under 5 attempts, replayed where 9 are allowed: the dry run and
    ``show`` say so, and whether today's budget would have given up too; one recorded
    before policies were kept says the policy is not known."""
    then = recorded_policy.policy_in_force(stack.settings.model_copy(update={"max_attempts": 5}))
    async with pg_connection(stack.database_url) as conn:
        kept = await _record(conn, "m-kept")
        await conn.execute(
            "UPDATE dead_letters SET policy = $2::jsonb, attempts = 5 WHERE id = $1",
            kept,
            then.as_json(),
        )
        await _record(conn, "m-old")
    env = {"EXPIRY_MAX_ATTEMPTS": "9"}
    dry = run_module(
        "service.deadletters", "replay", "m-kept", "m-old", "--dry-run", "--operator", "alice",
        env=stack.env(**env),
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    [kept_line] = [line for line in dry.stdout.splitlines() if "m-kept" in line]
    assert "max attempts 5 -> 9" in kept_line
    assert "would not have" in kept_line  # attempt 5 of 9: it would have retried
    [old_line] = [line for line in dry.stdout.splitlines() if "m-old" in line]
    assert "not known" in old_line
    shown = json.loads(
        run_module("service.deadletters", "show", "m-kept", "--json", env=stack.env(**env)).stdout
    )
    assert shown["policy"]["max_attempts"] == 5
    assert any("max attempts 5 -> 9" in line for line in shown["policy_changes"])
    as_then = stack.env(EXPIRY_MAX_ATTEMPTS="5", EXPIRY_MAX_AGE_SECONDS=str(then.max_age_seconds))
    same = run_module("service.deadletters", "show", "m-kept", env=as_then)
    assert "dead-lettered under:\n  the same" in same.stdout, same.stdout


INSERT_COMMAND_RECORD = """
INSERT INTO dead_letters (message_id, reservation_id, hold_until, error_class, give_up, reason,
                          attempts, first_seen, last_seen, worker)
VALUES ($1, $2, now(), 'db.unavailable', 'attempts-exhausted', 'r', 2, now(), now(), 'w')
RETURNING id
"""
BOB = postgres.Actor("bob", "root", "test-host")
LEFT_OUT = re.compile(r"^left out #(\d+)  ")


async def _command_record(conn: Any, message_id: str) -> int:
    """A dead letter whose command a replay rebuilds from its record (not in the queue)."""
    record_id: int = await conn.fetchval(INSERT_COMMAND_RECORD, message_id, uuid4())
    return record_id


async def _statuses(stack: Stack) -> dict[int, str]:
    async with pg_connection(stack.database_url) as conn:
        rows = await conn.fetch("SELECT id, status FROM dead_letters")
    return {row["id"]: row["status"] for row in rows}


async def test_a_saved_dry_run_replays_exactly_what_it_listed_and_names_the_rest(
    stack: Stack, tmp_path: Path
) -> None:
    """``replay --all --dry-run --json`` saved to a file, then ``replay --plan FILE``: of
    the four it listed only the one still as it was is replayed; one given an owner since,
    one replayed since and one gone are left out naming what changed, and the two that
    arrived since are left out as not in the dry run (``--all --yes`` would take them)."""
    async with pg_connection(stack.database_url) as conn:
        ids = [await _command_record(conn, f"m-{n}") for n in range(4)]
    dry = deadletters(
        stack, "replay", "--all", "--error-class", "db.unavailable", "--dry-run", "--json",
        "--operator", "alice",
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    saved = tmp_path / "plan.json"
    saved.write_text(dry.stdout)
    assert sorted(entry["id"] for entry in json.loads(dry.stdout)["plan"]) == ids

    async with pg_connection(stack.database_url) as conn:
        newcomers = [await _command_record(conn, f"m-new-{n}") for n in range(2)]
        await ownership.assign(conn, ids[1], "team-db", BOB)
        await conn.execute("DELETE FROM dead_letters WHERE id = $1", ids[3])
    by_bob = deadletters(stack, "replay", str(ids[2]), "--operator", "bob")
    assert by_bob.returncode == 0, by_bob.stdout + by_bob.stderr

    done = deadletters(stack, "replay", "--plan", str(saved), "--operator", "alice")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[:2] for line in lines if line.startswith("republished")] == [
        ["republished", f"#{ids[0]}"]
    ]
    left = {int(m.group(1)): line for line in lines if (m := LEFT_OUT.match(line))}
    assert set(left) == {ids[1], ids[2], ids[3], *newcomers}
    assert "changed since the dry run: owner set to team-db (by bob)" in left[ids[1]]
    assert "changed since the dry run: replayed (by bob)" in left[ids[2]]
    assert "no longer exists" in left[ids[3]]
    assert all("not in the dry run" in left[n] for n in newcomers)
    now = await _statuses(stack)
    assert (now[ids[0]], now[ids[1]], now[ids[2]]) == ("replayed", "dead", "replayed")
    assert [now[n] for n in newcomers] == ["dead", "dead"]
    assert await queue_depth(stack.amqp_url, "expirations") == 2  # bob's, and the plan's one

    again = deadletters(stack, "replay", "--plan", str(saved), "--operator", "alice", "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    machine = json.loads(again.stdout)
    assert machine["results"] == []
    assert {entry["id"] for entry in machine["left_out"]} == {*ids, *newcomers}
    assert await queue_depth(stack.amqp_url, "expirations") == 2


async def test_a_plan_file_that_is_not_a_dry_runs_is_refused_and_replays_nothing(
    stack: Stack, tmp_path: Path
) -> None:
    """A missing, malformed or forged plan file, or one given with a group's filters or
    ``--dry-run``: refused with one line (exit 2), nothing replayed, nothing audited."""
    async with pg_connection(stack.database_url) as conn:
        first = await _command_record(conn, "m-1")
    dry = deadletters(stack, "replay", str(first), "--dry-run", "--json", "--operator", "alice")
    good = json.loads(dry.stdout)
    forged = {**good, "plan": [{**good["plan"][0], "revision": "1;DROP"}]}
    files = {
        "missing.json": None,
        "text.json": "replay everything",
        "forged.json": json.dumps(forged),
        "twice.json": json.dumps({**good, "plan": good["plan"] * 2}),
        "good.json": json.dumps(good),
    }
    for name, text in files.items():
        if text is not None:
            (tmp_path / name).write_text(text)
    attempts = [
        ["--plan", str(tmp_path / "missing.json")],
        ["--plan", str(tmp_path / "text.json")],
        ["--plan", str(tmp_path / "forged.json")],
        ["--plan", str(tmp_path / "twice.json")],
        ["--plan", str(tmp_path / "good.json"), "--error-class", "db.unavailable"],
        ["--plan", str(tmp_path / "good.json"), "--dry-run"],
    ]
    for argv in attempts:
        refused = deadletters(stack, "replay", *argv, "--operator", "alice")
        said = [line for line in refused.stderr.splitlines() if not line.startswith("{")]
        assert refused.returncode == 2, (argv, refused.stdout, refused.stderr)
        assert len(said) == 1, (argv, refused.stderr)
        assert "refused:" in said[0], argv
        assert refused.stdout == "", argv
    assert await queue_depth(stack.amqp_url, "expirations") == 0
    async with pg_connection(stack.database_url) as conn:
        assert await conn.fetchval("SELECT count(*) FROM dead_letter_replays") == 0
    assert (await _statuses(stack))[first] == "dead"


async def test_a_saved_plan_and_an_unnamed_refusal_work_as_the_operators_role(
    stack: Stack, tmp_path: Path
) -> None:
    """As ``expiry_operator`` (least privilege): a dry run saved and replayed with --plan
    names the owner given since (it reads the audit trail), and a replay without
    --operator is refused and audited, the database recording the role."""
    async with pg_connection(stack.database_url) as conn:
        first, second = [await _command_record(conn, f"m-{n}") for n in range(2)]
    env = stack.env(
        DATABASE_URL=as_role(stack.database_url, "expiry_operator"),
        EXPIRY_REPLAY_OPERATORS="alice",
    )

    def operator(*args: str) -> subprocess.CompletedProcess[str]:
        return run_module("service.deadletters", *args, env=env)

    dry = operator("replay", "--all", "--dry-run", "--json", "--operator", "alice")
    assert dry.returncode == 0, dry.stderr
    saved = tmp_path / "plan.json"
    saved.write_text(dry.stdout)
    assigned = operator("assign", str(second), "--text", "team-db", "--operator", "bob")
    assert assigned.returncode == 0, assigned.stdout + assigned.stderr
    done = operator("replay", "--plan", str(saved), "--operator", "alice")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"republished      #{first}" in done.stdout
    assert f"left out #{second}" in done.stdout
    assert "owner set to team-db (by bob)" in done.stdout
    unnamed = operator("replay", str(second))
    assert unnamed.returncode == 2, unnamed.stdout + unnamed.stderr
    async with pg_connection(stack.database_url) as conn:
        audit = await conn.fetch(
            "SELECT dead_letter_id, operator, outcome, db_user FROM dead_letter_replays ORDER BY id"
        )
    assert [tuple(row) for row in audit] == [
        (first, "alice", "republished", "expiry_operator"),
        (second, "", "refused", "expiry_operator"),
    ]
