"""``python -m bench --quick`` as a user runs it: every figure, and nothing left behind; and
``python -m bench.outbox_aging`` on a few thousand events."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from pathlib import Path

import pytest

from tests.acceptance.demo_support import database_exists, vhost_exists
from tests.acceptance.processes import endpoints_env, run
from tests.support import Endpoints

# one_broker: the benchmark's figures and clean-up, a smoke run.
pytestmark = [pytest.mark.acceptance, pytest.mark.slow, pytest.mark.one_broker]

RUN_FIGURES = ("e2e", "cpu", "cpu_us", "rss", "machine")
EVENT_RUNS = ("events_off", "events_on", "events_relay")
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
    *(
        f"{what}.{run}"
        for run in ("events_off", "events_on", "events_relay")
        for what in RUN_FIGURES
    ),
    "relay.alone",
    "relay.alone_cpu_us",
    *(f"{what}.relay_consumers" for what in RUN_FIGURES),
    "relay.beside",
    "events.confirm_p50",
    "events.confirm_p99",
    "events.within",
    "events.mark_p50",
    "events.mark_p99",
    "events.batch_ms",
    "events.per_batch",
    "events.rate",
    "events.lag_p99",
    "events.relay_cpu",
    "machine.events",
    *(
        f"{figure}"
        for k in ("k1", "k2")
        for figure in (
            f"webhooks.{k}",
            f"webhooks.cpu_{k}",
            f"webhooks.cpu_us_{k}",
            f"webhooks.receiver_{k}",
            f"webhooks.attempt_bytes_{k}",
            f"machine.webhooks_{k}",
        )
    ),
    *(f"{what}.{run}" for run in ("webhooks_none", "webhooks_one") for what in RUN_FIGURES),
    # The pooler's phase (one repetition: straight first).
    *(
        f"{what}.{run}"
        for run in ("pooler_straight", "pooler_settings", "pooler_pgbouncer")
        for what in RUN_FIGURES
    ),
    "scan_memory.rss",
    "scan_memory.rate",
]
# The smoke run takes ~2 min on 2 cores; a busy machine may take half as long again.
BENCH_TIMEOUT_SECONDS = 360
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
    result = await asyncio.to_thread(
        run,
        "bench",
        "--quick",
        "--json",
        str(figures_file),
        env=endpoints_env(endpoints),
        timeout=BENCH_TIMEOUT_SECONDS,
    )

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
    assert len(targets) == 17  # 16, and the pooler's (issue 45)
    assert all(t is not None and "n/a" not in t[0] for t in targets), result.stdout
    ratios = section(result.stdout, "other ratios (")
    assert len(ratios) == 12  # 11, and the pooler settings' cost (issue 45)
    assert not any(line.endswith("n/a") for line in ratios)
    assert f"removed the database and the vhost {name}" in result.stdout
    assert not await database_exists(endpoints, name)
    assert not await vhost_exists(endpoints, name)
    assert not await asyncio.to_thread(logs.exists)


async def test_outbox_aging_prints_each_round_and_removes_its_sandbox(
    endpoints: Endpoints, tmp_path: Path
) -> None:
    """A small bench.outbox_aging: every round drained through the relay and measured."""
    figures_file = tmp_path / "aging.json"
    result = await asyncio.to_thread(
        run,
        "bench.outbox_aging",
        *("--events", "3000", "--round", "1000", "--json", str(figures_file)),
        env=endpoints_env(endpoints),
        timeout=BENCH_TIMEOUT_SECONDS,
    )

    assert result.returncode == 0, result.stdout + result.stderr
    found = re.search(r"database and vhost (bench_[0-9a-f]{8});", result.stdout)
    assert found, result.stdout
    rounds = json.loads(figures_file.read_text())
    assert [r["number"] for r in rounds] == [1, 2, 3]
    assert all(r["events"] == 1000 and r["rate"] > 0 for r in rounds), rounds
    assert "of the first" in result.stdout
    assert f"removed the database and the vhost {found[1]}" in result.stdout
    assert not await database_exists(endpoints, found[1])
    assert not await vhost_exists(endpoints, found[1])
