"""Dead webhook deliveries replayed by endpoint and by time, past the 1,000 of a group
(issue 44): the dry run says exactly what the replay does, and the replay does exactly
that, a page at a time, audited; newcomers and changed records are left out and named.

The command runs in this process (its own ``replay_command``, as the operator's role)
but where its exit code and its one line are what is checked, or the whole command
line is: there it runs as ``python -m service.deadletters``.
"""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from service import deadletters
from service.adapters import postgres
from service.core.errors import UsageError
from tests.support import Stack, as_role, pg_connection, run_module

pytestmark = pytest.mark.integration

# Dead deliveries to one endpoint and their dead letters, as the deliverer records them
# (deliveries.KILL, then dead_letter_rows.RECORD_DEAD_LETTER): $1 endpoint, $2 how many,
# $3 how many minutes ago they were last dead-lettered.
SEED_DEAD_DELIVERIES = """
WITH made AS (
    INSERT INTO webhook_deliveries (endpoint, message_id, reservation_id, hold_until,
                                    expired_at, attempts, dead, last_status, last_error)
    SELECT $1, 'expired:' || gen_random_uuid() || ':' || n, gen_random_uuid(),
           now() - interval '2 days', now() - interval '2 days', 15, true, 503,
           'webhook.unavailable'
      FROM generate_series(1, $2) AS n
    RETURNING endpoint, message_id, reservation_id, hold_until
)
INSERT INTO dead_letters (message_id, reservation_id, hold_until, error_class, give_up,
                          reason, attempts, first_seen, last_seen, worker)
SELECT 'webhook:' || endpoint || ':' || message_id, reservation_id, hold_until,
       'webhook.unavailable', 'attempts-exhausted', 'endpoint ' || endpoint || ': HTTP 503',
       15, now() - make_interval(mins => $3) - interval '1 hour',
       now() - make_interval(mins => $3), 'deliver-1'
  FROM made
RETURNING id
"""

SEED_COMMANDS = """
INSERT INTO dead_letters (message_id, error_class, give_up, reason, attempts, first_seen,
                          last_seen, worker)
SELECT 'expire:' || gen_random_uuid() || ':1', 'db.unavailable', 'attempts-exhausted', 'r',
       2, now(), now(), 'w'
  FROM generate_series(1, $1)
RETURNING id
"""

STATES = """
SELECT CASE WHEN d.message_id LIKE 'webhook:%' THEN split_part(d.message_id, ':', 2)
            ELSE 'command' END AS who,
       d.status, w.dead, w.attempts, w.origin, count(*) AS n
  FROM dead_letters d
  LEFT JOIN webhook_deliveries w
         ON d.message_id = 'webhook:' || w.endpoint || ':' || w.message_id
 GROUP BY 1, 2, 3, 4, 5
"""


def command_line(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m service.deadletters`` as ``expiry_operator``, with no broker reachable (a
    webhook delivery's replay needs none); alice and bob may replay."""
    environment = stack.env(
        DATABASE_URL=as_role(stack.database_url, "expiry_operator"),
        AMQP_URL="amqp://guest:guest@127.0.0.1:1/",
        EXPIRY_REPLAY_OPERATORS="alice,bob",
    )
    return run_module("service.deadletters", *args, env=environment)


class Run:
    """``deadletters`` run in this process, as the command line would with ``argv``."""

    def __init__(self, stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
        self.settings = stack.settings.model_copy(
            update={
                "database_url": as_role(stack.database_url, "expiry_operator"),
                "amqp_url": ["amqp://guest:guest@127.0.0.1:1/"],
                "replay_operators": ("alice", "bob"),
            }
        )
        self.capsys = capsys

    async def __call__(self, *argv: str) -> str:
        """What it printed (``UsageError`` when refused: the command line's exit 2)."""
        args = deadletters.build_parser().parse_args(list(argv))
        self.capsys.readouterr()
        if args.action == "replay":
            code = await deadletters.replay_command(self.settings, args)
        else:
            code = await deadletters.act_command(self.settings, args)
        assert code == 0
        return self.capsys.readouterr().out

    async def planned(self, *argv: str) -> list[int]:
        """The ids a dry run with ``--json`` lists."""
        out = await self("replay", "--all", *argv, "--dry-run", "--json", "--operator", "alice")
        return sorted(entry["id"] for entry in json.loads(out)["plan"])


@pytest.fixture
def run(stack: Stack, capsys: pytest.CaptureFixture[str]) -> Run:
    """The command, in this process, against the test's stack."""
    return Run(stack, capsys)


async def _seed(stack: Stack, endpoint: str, count: int, minutes_ago: float = 30) -> list[int]:
    async with pg_connection(stack.database_url) as conn:
        await conn.execute(
            "INSERT INTO webhook_endpoints (name) VALUES ($1) ON CONFLICT DO NOTHING", endpoint
        )
        rows = await conn.fetch(SEED_DEAD_DELIVERIES, endpoint, count, minutes_ago)
    return [row["id"] for row in rows]


async def _states(stack: Stack) -> dict[tuple[Any, ...], int]:
    """Dead letters counted by endpoint (or command), status, and their delivery's state."""
    async with pg_connection(stack.database_url) as conn:
        rows = await conn.fetch(STATES)
    return {tuple(row)[:-1]: row["n"] for row in rows}


async def _replays(stack: Stack) -> list[tuple[Any, ...]]:
    async with pg_connection(stack.database_url) as conn:
        rows = await conn.fetch(
            "SELECT dead_letter_id, operator, outcome, db_user FROM dead_letter_replays"
        )
    return [tuple(row) for row in rows]


async def test_an_endpoints_dead_deliveries_are_replayed_past_the_cap_exactly_as_listed(
    stack: Stack, run: Run, tmp_path: Path
) -> None:
    """1,200 dead deliveries to crm, 5 to stock, 2 dead commands: the dry run lists exactly
    crm's 1,200 (its text shows 1,000 lines and counts them all; its JSON lists each); one
    more dies after it; the saved plan replays exactly the 1,200 (their deliveries due
    again, each replay audited, as the operator's role, no broker), names the newcomer,
    and leaves stock's and the commands untouched."""
    crm = await _seed(stack, "crm", 1200)
    await _seed(stack, "stock", 5)
    async with pg_connection(stack.database_url) as conn:
        await conn.fetch(SEED_COMMANDS, 2)

    out = await run("replay", "--all", "--endpoint", "crm", "--dry-run", "--operator", "alice")
    lines = out.splitlines()
    assert "replay (dry run): 1200 selected, 1200 would-redeliver" in lines
    assert "... and 200 more, not shown (--json lists every one)" in lines
    assert sum(line.startswith("would-redeliver") for line in lines) == 1000
    assert "not in this plan" not in out
    assert lines[-1].endswith("endpoint crm")

    saved = await run(
        "replay", "--all", "--endpoint", "crm", "--dry-run", "--json", "--operator", "alice"
    )
    document = json.loads(saved)
    assert sorted(entry["id"] for entry in document["plan"]) == sorted(crm)
    assert {entry["outcome"] for entry in document["plan"]} == {"would-redeliver"}
    assert (document["beyond"], document["selection"]["group"]["endpoint"]) == (0, "crm")
    plan = tmp_path / "plan.json"
    plan.write_text(saved)

    [newcomer] = await _seed(stack, "crm", 1, minutes_ago=0)  # dead after the listing
    done = command_line(stack, "replay", "--plan", str(plan), "--operator", "alice")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "replay: 1200 selected, 1200 redelivering" in lines
    [left] = [line for line in lines if line.startswith("left out")]
    assert f"left out #{newcomer} " in left
    assert "not in the dry run: not replayed (it arrived since" in left

    assert await _states(stack) == {
        ("crm", "replayed", False, 0, "replay"): 1200,
        ("crm", "dead", True, 15, "automatic"): 1,  # the newcomer
        ("stock", "dead", True, 15, "automatic"): 5,
        ("command", "dead", None, None, None): 2,
    }
    audit = await _replays(stack)
    assert sorted(row[0] for row in audit) == sorted(crm)
    assert {row[1:] for row in audit} == {("alice", postgres.REDELIVERING, "expiry_operator")}


async def test_the_window_selects_by_when_they_died_and_a_changed_one_is_left_out(
    stack: Stack, run: Run, tmp_path: Path
) -> None:
    """crm's dead letters of 30 minutes, 3 hours and 10 days ago: --since and --until (how
    long ago, or ISO 8601) select by when each was last dead-lettered; a planned one given
    an owner after its dry run is left out, named with what changed; --all --yes replays
    the window it lists and nothing else."""
    recent = await _seed(stack, "crm", 10, minutes_ago=30)
    hours = await _seed(stack, "crm", 10, minutes_ago=180)
    days = await _seed(stack, "crm", 10, minutes_ago=10 * 24 * 60)
    four_hours_ago = (datetime.now(UTC) - timedelta(hours=4)).isoformat(timespec="seconds")

    assert await run.planned("--endpoint", "crm", "--since", "2h") == sorted(recent)
    assert await run.planned("--endpoint", "crm", "--until", "2h") == sorted(hours + days)
    assert await run.planned("--endpoint", "crm", "--since", "5h", "--until", "2h") == sorted(hours)
    assert await run.planned("--endpoint", "crm", "--since", four_hours_ago) == sorted(
        recent + hours
    )
    assert await run.planned("--since", "2w", "--until", "1w") == sorted(days)

    saved = await run(
        "replay", "--all", "--endpoint", "crm", "--since", "2h", "--dry-run", "--json",
        "--operator", "alice",
    )  # fmt: skip
    plan = tmp_path / "plan.json"
    plan.write_text(saved)
    await run("assign", str(recent[0]), "--text", "team-crm", "--operator", "bob")
    done = await run("replay", "--plan", str(plan), "--operator", "alice")
    assert "replay: 9 selected, 9 redelivering" in done
    [left] = [line for line in done.splitlines() if line.startswith("left out")]
    assert f"#{recent[0]} " in left
    assert "owner set to team-crm (by bob)" in left

    older = await run(
        "replay", "--all", "--endpoint", "crm", "--until", "2h", "--operator", "alice", "--yes"
    )
    assert "replay: 20 selected, 20 redelivering" in older
    assert sorted(row[0] for row in await _replays(stack)) == sorted(recent[1:] + hours + days)


async def test_the_new_filters_are_refused_with_one_line_and_an_unknown_endpoint_selects_nothing(
    stack: Stack, run: Run, tmp_path: Path
) -> None:
    """--endpoint, --since and --until with named dead letters or a saved plan, a TIME that
    is none, an empty window or name: refused with one line (exit 2), nothing audited. A
    name no endpoint has selects nothing, and says so. An operator who may not replay is
    refused, and audited on each dead letter selected."""
    [first, *rest] = await _seed(stack, "crm", 3)
    plan = tmp_path / "plan.json"
    plan.write_text(await run("replay", str(first), "--dry-run", "--json", "--operator", "alice"))
    refused = [
        [str(first), "--endpoint", "crm"],
        [str(first), "--since", "2h"],
        [str(first), "--until", "2h"],
        ["--plan", str(plan), "--endpoint", "crm"],
        ["--plan", str(plan), "--since", "2h"],
        ["--all", "--endpoint", "crm", "--since", "yesterday"],
        ["--all", "--endpoint", "crm", "--since", "1h", "--until", "2h"],
        ["--all", "--endpoint", " "],
        ["--all", "--endpoint", "crm", "--since", "2030-01-01"],
    ]
    for argv in refused:
        with pytest.raises(UsageError) as said:
            await run("replay", *argv, "--operator", "alice", "--yes")
        assert "\n" not in str(said.value), argv
    said_by_the_command_line = {
        "--endpoint selects a group: add --all": refused[0],
        "--plan carries its selection: no --since": refused[4],
    }
    for line, argv in said_by_the_command_line.items():
        done = command_line(stack, "replay", *argv, "--operator", "alice", "--yes")
        errors = [e for e in done.stderr.splitlines() if not e.startswith("{")]
        assert (done.returncode, done.stdout, len(errors)) == (2, "", 1), done.stderr
        assert "refused:" in errors[0]
        assert line in errors[0]
    assert await _replays(stack) == []

    unknown = await run(
        "replay", "--all", "--endpoint", "nosuch", "--dry-run", "--operator", "alice"
    )
    assert "replay (dry run): 0 selected" in unknown
    assert "nothing to replay" in unknown
    assert "no endpoint 'nosuch' is registered: the name selects nothing" in unknown

    with pytest.raises(UsageError, match="'mallory' may not replay"):
        await run("replay", "--all", "--endpoint", "crm", "--operator", "mallory", "--yes")
    audit = await _replays(stack)
    assert sorted(row[0] for row in audit) == sorted([first, *rest])
    assert {row[1:3] for row in audit} == {("mallory", "refused")}
