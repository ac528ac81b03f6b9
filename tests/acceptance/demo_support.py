"""Helpers for the demo's acceptance tests: run it, read its summary, look for leftovers."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import httpx

from tests.support import Endpoints, Management, pg_connection

REPO = Path(__file__).resolve().parents[2]
SUMMARY_LINE = re.compile(r"^  (?P<label>[a-z][a-z ]+?)\s{2,}(?P<value>\S.*)$")
CHECK_LINE = re.compile(r"^  \[(?P<status>ok|FAILED)\] (?P<check>.+)$")


def run_demo(
    endpoints: Endpoints, *args: str, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """``python -m service.demo ARGS`` against the test run's servers (stdout is not a TTY)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXPIRY_")}
    env |= {
        "DATABASE_URL": endpoints.database_url,
        "AMQP_URL": endpoints.amqp_url,
        "RABBITMQ_MANAGEMENT_URL": endpoints.management_url,
    }
    return subprocess.run(
        [sys.executable, "-m", "service.demo", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def summary_of(stdout: str) -> dict[str, str]:
    """The summary table after the ``summary (...)`` line: label -> value."""
    _, _, table = stdout.partition("\nsummary (")
    rows = (SUMMARY_LINE.match(line) for line in table.splitlines()[1:])
    return {row["label"]: row["value"] for row in rows if row}


def checks_of(stdout: str) -> dict[str, str]:
    """The ``[ok]`` / ``[FAILED]`` lines: check -> status."""
    rows = (CHECK_LINE.match(line) for line in stdout.splitlines())
    return {row["check"]: row["status"] for row in rows if row}


def logs_dir_of(stdout: str) -> Path:
    """The folder the demo named for its processes' logs."""
    match = re.search(r"^  logs +(\S+)$", stdout, re.MULTILINE)
    assert match, stdout
    return Path(match[1])


async def database_exists(endpoints: Endpoints, name: str) -> bool:
    async with pg_connection(endpoints.database_url) as conn:
        found = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
    return found is not None


async def vhost_exists(endpoints: Endpoints, name: str) -> bool:
    management = Management(endpoints.management_url)
    async with httpx.AsyncClient(base_url=management.base, auth=management.auth) as client:
        response = await client.get(f"/api/vhosts/{quote(name, safe='')}")
    return response.status_code == 200


async def remove_sandbox(endpoints: Endpoints, name: str) -> None:
    """Remove what a demo run with ``--keep`` left."""
    with contextlib.suppress(Exception):
        await Management(endpoints.management_url).delete_vhost(name)
    async with pg_connection(endpoints.database_url) as conn:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
