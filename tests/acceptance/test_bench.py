"""``python -m bench --quick`` as a user runs it: every figure, and nothing left behind."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from pathlib import Path

import pytest

from tests.acceptance.demo_support import database_exists, run_bench, vhost_exists
from tests.support import Endpoints

pytestmark = [pytest.mark.acceptance, pytest.mark.slow]

RUN_FIGURES = ("e2e", "cpu", "cpu_us", "rss", "machine")
FIGURES = [
    "raw.publish",
    "raw.consume",
    "raw.cpu_us",
    "raw.rss",
    "db.batched",
    "scan.rate",
    "scan.rss",
    *(f"{what}.{run}" for run in ("k1", "k2", "metrics", "per_message") for what in RUN_FIGURES),
    "e2e.peer",
    "cpu_us.peer",
    *(f"{what}.trace100" for what in (*RUN_FIGURES, "spans")),
    *(f"{what}.trace10" for what in (*RUN_FIGURES, "spans")),
    *(f"{what}.production" for what in (*RUN_FIGURES, "spans")),
    "locked.rate",
    "locked.at_release",
    "locked.after",
    "lag.p50",
    "lag.p99",
    "lag.max",
    "sustained.rate",
    "sustained.cpu",
    "sustained.rss",
    "sustained.scan",
    "machine.sustained",
    "capacity.rate",
    "capacity.scanners2",
    "scan_memory.rss",
    "scan_memory.rate",
]
TARGET_LINE = re.compile(r"^  \[(  met  |NOT MET|  n/a  )\] (?P<what>.+?)\s{2,}(?P<value>\S+)")


def section(stdout: str, title: str) -> list[str]:
    """The indented lines right after the line that starts with ``title``."""
    _, _, rest = stdout.partition(f"\n{title}")
    return list(itertools.takewhile(lambda line: line.startswith("  "), rest.splitlines()[1:]))


async def test_quick_run_prints_every_figure_and_target_and_removes_its_sandbox(
    endpoints: Endpoints, tmp_path: Path
) -> None:
    """--quick: exit 0, every figure measured and printed, every target judged, no leftovers."""
    figures_file = tmp_path / "bench.json"
    result = await asyncio.to_thread(run_bench, endpoints, "--quick", "--json", str(figures_file))

    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    found = re.search(r"database and vhost (bench_[0-9a-f]{8}); logs (\S+)$", result.stdout, re.M)
    assert found, result.stdout
    name, logs = found[1], Path(found[2])
    document = json.loads(figures_file.read_text())
    # PostgreSQL's and RabbitMQ's own CPU are there only when those servers are local.
    measured = [key for key in document["figures"] if not key.startswith(("pg.", "rmq."))]
    assert measured == FIGURES
    table = section(result.stdout, "results (min / median / max")
    for key, figure in document["figures"].items():
        assert figure["samples"], key
        assert any(figure["label"] in line for line in table), figure["label"]
    assert document["machine"]["postgresql"]
    assert document["machine"]["rabbitmq"]
    targets = [TARGET_LINE.match(line) for line in section(result.stdout, "targets (")]
    assert len(targets) == 13
    assert all(t is not None and "n/a" not in t[0] for t in targets), result.stdout
    ratios = section(result.stdout, "other ratios (")
    assert len(ratios) == 6
    assert not any(line.endswith("n/a") for line in ratios)
    assert f"removed the database and the vhost {name}" in result.stdout
    assert not await database_exists(endpoints, name)
    assert not await vhost_exists(endpoints, name)
    assert not await asyncio.to_thread(logs.exists)
