"""The on-call's signals on a real Prometheus: every series the dashboard and the alert
rules use exists and moves, and the oldest-due alert fires and resolves.

Debian's ``prometheus`` server scrapes, every second, a real consumer and a real
``produce --every`` (their ``EXPIRY_HTTP_PORT``) working off real holds, and
RabbitMQ's own plugin (``:15692/metrics/detailed``); it evaluates
``prometheus/alerts.yml`` every second, with each ``for:`` shortened to 2 s (the
only change: the expressions are the shipped ones). Skips where ``prometheus``
or the RabbitMQ plugin is missing, except under ``CI=true``.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import signal
import subprocess
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.processes import output_so_far, start, stop
from tests.observability import RULES, metric_names
from tests.outbox_rows import mark_all_sent
from tests.support import (
    Stack,
    eventually,
    free_port,
    insert_holds,
    missing,
    publish_raw,
    wait_for_consumers,
)
from tests.support import pg_connection as pg
from tests.webhook_support import LOOPBACK, receiving

pytestmark = [pytest.mark.acceptance, pytest.mark.prometheus]

RABBITMQ_METRICS = "http://127.0.0.1:15692/metrics/detailed"


class Prometheus:
    """A private server: its config, its port, its HTTP API."""

    def __init__(self, tmp: Path, targets: dict[str, int]) -> None:
        self.port = free_port()
        self.dir = tmp
        rules = re.sub(r"(?m)^(\s+for:) \S+$", r"\1 2s", RULES.read_text())
        (tmp / "alerts.yml").write_text(rules)
        jobs: list[dict[str, Any]] = [
            {"job_name": name, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
            for name, port in targets.items()
        ]
        jobs.append(
            {
                "job_name": "rabbitmq",
                "metrics_path": "/metrics/detailed",
                "params": {"family": ["queue_coarse_metrics", "queue_consumer_count"]},
                "static_configs": [{"targets": ["127.0.0.1:15692"]}],
            }
        )
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(tmp / "alerts.yml")],
            "scrape_configs": jobs,
        }
        (tmp / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML

    def start(self) -> None:
        """Run the server, its output going to a file."""
        binary = shutil.which("prometheus")
        assert binary is not None
        with (self.dir / "prometheus.log").open("wb") as log:
            self.server = subprocess.Popen(
                [
                    binary,
                    f"--config.file={self.dir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={self.dir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=log,
                stderr=log,
            )

    def stop(self) -> None:
        """SIGTERM, and wait."""
        self.server.send_signal(signal.SIGTERM)
        self.server.wait(timeout=30)

    def log(self) -> str:
        """What the server wrote."""
        return (self.dir / "prometheus.log").read_text(errors="replace")

    def get(self, path: str, **query: str) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}?{urllib.parse.urlencode(query)}"
        with urllib.request.urlopen(url, timeout=5) as answer:
            return json.load(answer)["data"]

    async def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result (vectors)."""
        data = await asyncio.to_thread(self.get, "/api/v1/query", query=expr)
        result: list[dict[str, Any]] = data["result"]
        return result

    async def value(self, expr: str) -> float | None:
        """The single value of ``expr``, or None if it is empty."""
        result = await self.query(expr)
        return float(result[0]["value"][1]) if result else None

    async def firing(self, alert: str) -> bool:
        data = await asyncio.to_thread(self.get, "/api/v1/alerts")
        return any(
            a["labels"]["alertname"] == alert and a["state"] == "firing" for a in data["alerts"]
        )

    async def ready(self) -> bool:
        try:
            await asyncio.to_thread(self.get, "/api/v1/status/runtimeinfo")
        except OSError:
            return False
        return True


def _requirements(amqp_url: str) -> None:
    if shutil.which("prometheus") is None:
        missing("Debian's prometheus is not installed (apt install prometheus)")
    try:
        with urllib.request.urlopen(RABBITMQ_METRICS + "?family=queue_consumer_count", timeout=5):
            pass
    except OSError:
        missing("RabbitMQ's Prometheus plugin does not answer on 15692 (rabbitmq-plugins enable)")
    parts = urllib.parse.urlsplit(amqp_url)
    if (parts.hostname, parts.port or 5672) not in (("127.0.0.1", 5672), ("localhost", 5672)):
        missing("the test reads the Prometheus plugin of this machine's broker (127.0.0.1:5672)")


@pytest.fixture
def prometheus_tmp(tmp_path: Path, stack: Stack) -> Path:
    _requirements(stack.amqp_url)
    return tmp_path


@pytest.fixture
async def running(
    stack: Stack, prometheus_tmp: Path
) -> AsyncIterator[tuple[Prometheus, dict[str, str], dict[str, asyncio.subprocess.Process]]]:
    """A consumer, a scanner and a deliverer (to a receiver on the loopback) serving their
    endpoints, and Prometheus scraping them."""
    ports = {
        "expiry-consumer": free_port(),
        "expiry-scanner": free_port(),
        "expiry-deliver": free_port(),
    }
    env = stack.env(
        EXPIRY_OLDEST_DUE_OBJECTIVE_SECONDS="3",
        EXPIRY_EVENTS_OBJECTIVE_SECONDS="3",
        EXPIRY_LOCK_TIMEOUT_MS="300",
        EXPIRY_LEASE_SECONDS="2",
        EXPIRY_HTTP_HOST="127.0.0.1",
    )
    async with receiving() as receiver:
        endpoint = {
            "name": "orders",
            "url": receiver.url(),
            "secret": receiver.secret,
            "allow_networks": LOOPBACK,
        }
        processes = {
            "consumer": await start(
                "service.consume", env=env | {"EXPIRY_HTTP_PORT": str(ports["expiry-consumer"])}
            ),
            "scanner": await start(
                "service.produce",
                "--every",
                "1",
                env=env | {"EXPIRY_HTTP_PORT": str(ports["expiry-scanner"])},
            ),
            "deliver": await start(
                "service.deliver",
                env=env
                | {
                    "EXPIRY_HTTP_PORT": str(ports["expiry-deliver"]),
                    "EXPIRY_WEBHOOKS": json.dumps([endpoint]),
                },
            ),
        }
        prometheus = Prometheus(prometheus_tmp, ports)
        prometheus.start()
        try:
            await eventually(prometheus.ready, timeout=30)
            await wait_for_consumers(stack.amqp_url, 1)
            yield prometheus, env | {"EXPIRY_HTTP_PORT": str(ports["expiry-consumer"])}, processes
        finally:
            prometheus.stop()
            for process in processes.values():
                if process.returncode is None:
                    await stop(process)


async def _locked_until_retried(stack: Stack, consumer: asyncio.subprocess.Process) -> None:
    """A hold that comes due while another transaction locks the reservations table
    (``SHARE`` mode: the scan's claims do not wait for it, every update does) until the
    consumer has retried it. The scanner publishes it and records its lease; the consumer's
    update waits out its lock timeout and is retried through a delay tier (db.timeout); once
    the lock is gone it expires, after its recorded publish (so its claim-to-finish time is
    recorded too, whatever the race between the other holds' expiry and their leases'
    recording). The lock is held until the consumer says so, not for a time that a loaded
    machine's scanner and consumer might not keep to."""
    [rid] = await insert_holds(stack.database_url, 1, due_in=1.0)

    async def retried() -> bool:
        return any(
            "expiry.retry" in line and str(rid) in line
            for line in output_so_far(consumer).splitlines()
        )

    async with pg(stack.database_url) as conn, conn.transaction():
        await conn.execute("LOCK TABLE reservations IN SHARE MODE")
        await eventually(retried, timeout=60)


async def test_every_series_the_rules_and_the_dashboard_use_exists_and_moves(
    stack: Stack,
    running: tuple[Prometheus, dict[str, str], dict[str, asyncio.subprocess.Process]],
) -> None:
    """Holds expire (one after a lock timeout and a retry), poison is dead-lettered: every
    metric name in prometheus/alerts.yml and the dashboard has series, and the counters and
    the scanner's last success move."""
    prometheus, _env, processes = running
    vhost = stack.vhost
    await insert_holds(stack.database_url, 50)
    await _locked_until_retried(stack, processes["consumer"])
    await publish_raw(stack.amqp_url, [b"not json"], message_ids=["poison-prom"])
    await insert_holds(stack.database_url, 50)
    names = metric_names()
    assert {"expiry_oldest_due_age_seconds", "rabbitmq_detailed_queue_consumers"} <= names

    missing = set(names)

    async def every_name_has_series() -> bool:
        for name in sorted(missing):
            matcher = f'{{vhost="{vhost}"}}' if name.startswith("rabbitmq_") else ""
            if await prometheus.query(f"{name}{matcher}"):
                missing.discard(name)
        return not missing

    try:
        await eventually(every_name_has_series, timeout=90, every=1)
    except TimeoutError:
        pytest.fail(f"no series after 90 s for: {', '.join(sorted(missing))}")
    moved = {
        "expiry_commands_total": 'sum(expiry_commands_total{outcome="expired"})',
        "expiry_retries_total": "sum(expiry_retries_total)",
        "expiry_dead_letters_recorded_total": "sum(expiry_dead_letters_recorded_total)",
        "expiry_scan_published_total": "sum(expiry_scan_published_total)",
        "expiry_lag_seconds": "sum(expiry_lag_seconds_count)",
        "expiry_claim_to_finish_seconds": "sum(expiry_claim_to_finish_seconds_count)",
    }
    for name, expr in moved.items():
        value = await prometheus.value(expr)
        assert (value or 0) > 0, f"{name} did not move: {value}"

    async def the_poison_is_open_unowned_and_ageing() -> bool:
        """The only dead letter (no EXPIRY_DEAD_LETTER_OWNERS here): read by the consumer."""
        unowned = await prometheus.value("max(expiry_dead_letters_unowned)")
        oldest = await prometheus.value("max(expiry_oldest_open_dead_letter_age_seconds)")
        return unowned == 1 and (oldest or 0) > 0

    await eventually(the_poison_is_open_unowned_and_ageing, timeout=60, every=1)
    objective = await prometheus.value("max(expiry_dead_letter_age_objective_seconds)")
    assert objective == 86400  # EXPIRY_DEAD_LETTER_AGE_OBJECTIVE_SECONDS's default

    async def every_expiry_waits_in_the_outbox() -> bool:
        """No relay runs here: the consumer reports each expiry's event as pending."""
        pending = await prometheus.value("max(expiry_events_pending)")
        oldest = await prometheus.value("max(expiry_events_oldest_pending_age_seconds)")
        return pending == 101 and (oldest or 0) > 0

    await eventually(every_expiry_waits_in_the_outbox, timeout=60, every=1)
    assert await prometheus.value("max(expiry_events_objective_seconds)") == 3
    first = await prometheus.value("max(expiry_scan_last_success_timestamp_seconds)")
    assert (first or 0) > 0
    later: float | None = None

    async def the_last_success_moved() -> bool:
        """A later pass's success, once scraped (waited for, not slept for)."""
        nonlocal later
        later = await prometheus.value("max(expiry_scan_last_success_timestamp_seconds)")
        return (later or 0) > (first or 0)

    await eventually(the_last_success_moved, timeout=60, every=1)
    assert (later or 0) > (first or 0) > 0
    consumers = await prometheus.value(
        f'rabbitmq_detailed_queue_consumers{{vhost="{vhost}",queue="expirations"}}'
    )
    assert consumers == 1
    drift = await prometheus.value("max(abs(expiry_clock_drift_seconds))")
    assert drift is not None
    assert drift < 1  # same host, same clock


async def test_the_oldest_due_alert_fires_without_consumers_and_resolves_with_them(
    stack: Stack,
    running: tuple[Prometheus, dict[str, str], dict[str, asyncio.subprocess.Process]],
) -> None:
    """Consumers stopped with holds due: the scanner keeps reporting the oldest due hold's
    age, which passes the 3 s objective, and the alert fires; a consumer back: it resolves.
    Meanwhile the scan republishes the held holds whose 2 s leases lapse."""
    prometheus, env, processes = running
    code, output = await stop(processes.pop("consumer"))
    assert code == 0, output
    await insert_holds(stack.database_url, 20)
    await eventually(
        lambda: prometheus.firing("ExpiryOldestDueHoldOverObjective"), timeout=60, every=1
    )
    lapsed = await prometheus.value("sum(expiry_scan_leases_lapsed_total)")
    assert (lapsed or 0) > 0
    processes["consumer"] = await start("service.consume", env=env)

    async def resolved() -> bool:
        return not await prometheus.firing("ExpiryOldestDueHoldOverObjective")

    await eventually(resolved, timeout=90, every=1)
    async with pg(stack.database_url) as conn:
        held = await conn.fetchval("SELECT count(*) FROM reservations WHERE status = 'held'")
    assert held == 0


async def test_the_events_alert_fires_without_a_relay_and_resolves_once_they_are_sent(
    stack: Stack,
    running: tuple[Prometheus, dict[str, str], dict[str, asyncio.subprocess.Process]],
) -> None:
    """Holds expire and no relay runs: the consumer reports the oldest pending event's age,
    which passes the 3 s objective, and ExpiryEventsBehind fires; once the events are sent
    (as a relay marks them), it resolves."""
    prometheus, _env, _processes = running
    await insert_holds(stack.database_url, 5)
    await eventually(lambda: prometheus.firing("ExpiryEventsBehind"), timeout=60, every=1)
    async with pg(stack.database_url) as conn:
        assert await mark_all_sent(conn) == 5

    async def resolved() -> bool:
        return not await prometheus.firing("ExpiryEventsBehind")

    await eventually(resolved, timeout=60, every=1)
