"""``python -m service.demo`` as a newcomer runs it, at a small size."""

from __future__ import annotations

import itertools
import shutil

import pytest

from tests.acceptance.demo_support import (
    checks_of,
    database_exists,
    logs_dir_of,
    remove_sandbox,
    run_demo,
    summary_of,
    vhost_exists,
)
from tests.support import RUN_ID, Endpoints, pg_connection, with_database

# one_broker: the demo's output and clean-up: its pipeline is the one the integration and
# acceptance tests run on every broker version.
pytestmark = [pytest.mark.acceptance, pytest.mark.one_broker]

_numbers = itertools.count(1)


def _name() -> str:
    return f"expiry_demo_t_{RUN_ID}_{next(_numbers)}"


async def test_demo_ends_every_hold_in_exactly_one_state_and_cleans_up(
    endpoints: Endpoints,
) -> None:
    """200 holds, 2 consumers: exit 0, a summary whose numbers add up, nothing left behind."""
    name = _name()
    result = run_demo(endpoints, "--holds", "200", "--consumers", "2", "--name", name)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    summary = summary_of(result.stdout)
    assert summary["holds placed"] == "200"
    expired, consumed = int(summary["expired by the service"]), int(summary["consumed by support"])
    assert expired + consumed == 200
    assert consumed > 0  # the support side did win some races at the deadline
    assert summary["still held"] == "0 (0 past their deadline)"
    assert summary["ended in exactly one state"] == "200 of 200"
    assert summary["transitions per expired hold"].startswith("min 1, max 1 (0 not exactly 1;")
    assert summary["dead letters"] == "0"
    assert summary["deliveries"].startswith(f"{expired} expired, 0 already-done")
    assert summary["expirations by consumer"].count("demo-consumer-") == 2
    assert set(checks_of(result.stdout).values()) == {"ok"}
    assert len(checks_of(result.stdout)) == 7
    assert result.stdout.rstrip().splitlines()[-2:] == [
        "RESULT: OK",
        f"removed the database and the vhost {name}",
    ]
    progress = [line for line in result.stdout.splitlines() if " held " in line]
    assert progress, "no live progress lines"
    assert "retrying" in progress[0]
    assert "oldest due" in progress[0]
    assert not await database_exists(endpoints, name)
    assert not await vhost_exists(endpoints, name)
    assert not logs_dir_of(result.stdout).exists()


async def test_demo_keep_leaves_the_database_vhost_and_logs_for_inspection(
    endpoints: Endpoints,
) -> None:
    """--keep: the database (every hold in a final state), the vhost and the logs remain."""
    name = _name()
    try:
        result = run_demo(endpoints, "--holds", "20", "--consumers", "1", "--keep", "--name", name)
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"kept for inspection: database {name}, vhost {name}" in result.stdout
        assert await vhost_exists(endpoints, name)
        async with pg_connection(with_database(endpoints.database_url, name)) as conn:
            rows = await conn.fetch("SELECT status, count(*) AS n FROM reservations GROUP BY 1")
        counts = {row["status"]: row["n"] for row in rows}
        assert "held" not in counts
        assert sum(counts.values()) == 20
        logs = logs_dir_of(result.stdout)
        assert sorted(path.name for path in logs.iterdir()) == [
            "consumer-1.log",
            "migrate.log",
            "scan.log",
        ]
        shutil.rmtree(logs)
    finally:
        await remove_sandbox(endpoints, name)


def test_demo_refuses_a_name_that_is_not_a_plain_identifier(endpoints: Endpoints) -> None:
    """The name becomes a database and a vhost: anything but [a-z][a-z0-9_]* is refused."""
    result = run_demo(endpoints, "--name", "Robert'); DROP TABLE students;--")
    assert result.returncode == 2
    assert "argument --name" in result.stderr
