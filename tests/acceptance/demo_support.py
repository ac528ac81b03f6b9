"""Helpers for the demo's and the benchmark's acceptance tests: run them, read the demo's
summary, look for leftovers (through the service's own management client)."""

from __future__ import annotations

import contextlib
import re
import subprocess
from pathlib import Path

from service.adapters.postgres.databases import drop_database
from tests.acceptance.processes import endpoints_env, run
from tests.support import Endpoints, Management, pg_connection

SUMMARY_LINE = re.compile(r"^  (?P<label>[a-z][a-z ]+?)\s{2,}(?P<value>\S.*)$")
CHECK_LINE = re.compile(r"^  \[(?P<status>ok|FAILED)\] (?P<check>.+)$")


def run_demo(
    endpoints: Endpoints, *args: str, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """``python -m service.demo ARGS`` against the test run's servers (stdout is not a TTY)."""
    return run("service.demo", *args, env=endpoints_env(endpoints), timeout=timeout)


def run_bench(endpoints: Endpoints, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m bench ARGS`` against the test run's servers."""
    return run("bench", *args, env=endpoints_env(endpoints), timeout=180)


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
    """Whether the server of the test run holds database ``name``."""
    async with pg_connection(endpoints.database_url) as conn:
        found = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
    return found is not None


async def vhost_exists(endpoints: Endpoints, name: str) -> bool:
    """Whether the broker of the test run holds vhost ``name``."""
    names = await Management(endpoints.management_url).request("GET", "/vhosts", columns="name")
    return name in {str(vhost["name"]) for vhost in names}


async def remove_sandbox(endpoints: Endpoints, name: str) -> None:
    """Remove what a demo run with ``--keep`` left."""
    with contextlib.suppress(Exception):
        await Management(endpoints.management_url).delete_vhost(name)
    await drop_database(endpoints.database_url, name)
