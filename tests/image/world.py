"""One image test's world: its database and vhost, each command's settings as the
deployment gives them (a role and a user of its own), and the checks of the outcome."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace

from tests.events_support import expected_message_id
from tests.image.containers import Containers
from tests.support import (
    as_role,
    eventually,
    free_port,
    pg_connection,
    transitions_per_reservation,
)

# What the image tests did, printed at the end of the session (conftest.py).
FIGURES: list[str] = []

# The database roles of migration 0005 (docs/reference.md, "Database roles").
CONSUMER_ROLE = "expiry_consumer"
SCAN_ROLE = "expiry_scan"
OPERATOR_ROLE = "expiry_operator"
RELAY_ROLE = "expiry_relay"  # migration 0014_events
DELIVER_ROLE = "expiry_deliver"  # migration 0015_webhooks

# compose.yaml's stop_grace_period for a consumer, as deploy/kubernetes derives it:
# EXPIRY_SHUTDOWN_TIMEOUT_SECONDS (30) + the span export's flush (15) + 5.
CONSUMER_GRACE = 50
SCANNER_GRACE = 20
# The relay's, as compose.yaml and deploy/kubernetes/base/relay.yaml derive it: the batch in
# hand's confirms (EXPIRY_PUBLISH_TIMEOUT_SECONDS, 10) and mark (EXPIRY_STATEMENT_TIMEOUT_MS,
# 10 s) + the span export's flush (15) + 5.
RELAY_GRACE = 40
# The deliverer's: the attempts in flight (each within its endpoint's timeout_seconds, 10
# by default) and their settle + the span export's flush (15) + 5, rounded up.
DELIVER_GRACE = 40
# How often the image's HEALTHCHECK runs here (its own interval, 30 s, is for production).
HEALTH_INTERVAL = "1s"

# Every container's settings, besides its URLs (as compose and the manifests set them).
COMMON = {
    "EXPIRY_LOG_FORMAT": "json",
    # A test run's quick budgets, as the other suites use (tests/support.py).
    "EXPIRY_RETRY_DELAYS": "1,2",
    "EXPIRY_RETRY_JITTER": "0",
    "EXPIRY_MAX_ATTEMPTS": "5",
}


@dataclass(frozen=True)
class World:
    """The test's empty database and vhost (the migrating admin's URLs), and its containers."""

    database_url: str  # the admin: it migrates and so owns the tables, as expiry_owner would
    amqp_url: str  # a user that may configure the vhost, as expiry-deploy would
    management_url: str  # without credentials: each process logs in as its AMQP user
    containers: Containers

    def env(self, role: str | None = None, **extra: str) -> dict[str, str]:
        """Settings of a command that connects as database ``role`` (default: the admin)."""
        database_url = self.database_url if role is None else as_role(self.database_url, role)
        return {
            "DATABASE_URL": database_url,
            "AMQP_URL": self.amqp_url,
            "EXPIRY_MANAGEMENT_URL": self.management_url,
            **COMMON,
            **extra,
        }

    def of(self, containers: Containers) -> World:
        """The same database and vhost, with the containers of another image."""
        return replace(self, containers=containers)

    async def run_step(self, module: str, *args: str, role: str | None = None) -> float:
        """Run a one-off command in a container; it must exit 0. Its seconds."""
        done = await self.containers.run(module, python_m(module, *args), self.env(role))
        assert done.exit_code == 0, f"{module} exited {done.exit_code}: {done.output[-3000:]}"
        return done.seconds

    async def start_serving(self, name: str, command: list[str], role: str, **extra: str) -> str:
        """A long-running command with its HTTP endpoint (so that the image's health check
        asks /readyz too), once healthy; its container's name."""
        env = self.env(role, EXPIRY_HTTP_HOST="127.0.0.1", EXPIRY_HTTP_PORT=str(free_port()))
        env.update(extra)
        started = await self.containers.start(
            name, command, env, "--health-interval", HEALTH_INTERVAL
        )
        await self.containers.wait_healthy(started)
        return started

    async def wait_expired(self, count: int, timeout: float = 120) -> None:
        """Wait until ``count`` holds in all are expired."""

        async def reached() -> bool:
            return await self.expired() >= count

        await eventually(reached, timeout=timeout, every=0.05)

    async def expired(self) -> int:
        """Holds expired so far."""
        async with pg_connection(self.database_url) as conn:
            count: int = await conn.fetchval(
                "SELECT count(*) FROM reservations WHERE status = 'expired'"
            )
        return count

    async def event_ids(self, ids: list[uuid.UUID]) -> list[str]:
        """The message id of the event of each hold of ``ids`` (the contract's form)."""
        async with pg_connection(self.database_url) as conn:
            rows = await conn.fetch(
                "SELECT id, hold_until FROM reservations WHERE id = ANY($1::uuid[])", ids
            )
        return [expected_message_id(row["id"], row["hold_until"]) for row in rows]

    async def assert_each_expired_once(self, ids: list[uuid.UUID]) -> None:
        """Every hold of ``ids`` is expired, with exactly one audited transition."""
        wanted = set(ids)
        async with pg_connection(self.database_url) as conn:
            rows = await conn.fetch(
                "SELECT id, status FROM reservations WHERE id = ANY($1::uuid[])", list(wanted)
            )
        not_expired = [row["id"] for row in rows if row["status"] != "expired"]
        assert len(rows) == len(wanted), "holds went missing"
        assert not not_expired, f"{len(not_expired)} holds not expired, e.g. {not_expired[:3]}"
        transitions = await transitions_per_reservation(self.database_url)
        counts = [transitions.get(hold, 0) for hold in wanted]
        twice = sum(1 for count in counts if count > 1)
        assert twice == 0, f"{twice} holds have more than one transition"
        assert min(counts) == 1


def python_m(module: str, *args: str) -> list[str]:
    """The container command ``python -m service.<module> args``."""
    return ["python", "-m", f"service.{module}", *args]


async def insert_holds_due_over(url: str, count: int, seconds: float) -> list[uuid.UUID]:
    """``count`` holds whose deadlines fall evenly over the next ``seconds``."""
    async with pg_connection(url) as conn:
        rows = await conn.fetch(
            """
            INSERT INTO reservations (id, hold_until)
            SELECT gen_random_uuid(), now() + make_interval(secs => n * $2::float8 / $1)
              FROM generate_series(1, $1) AS n
            RETURNING id
            """,
            count,
            seconds,
        )
    return [row["id"] for row in rows]


async def stop_ok(containers: Containers, name: str, grace: float) -> float:
    """``docker stop``: the process must exit 0 within ``grace``; the seconds it took."""
    finished = await containers.stop(name, grace)
    assert finished.exit_code == 0, f"{name} exited {finished.exit_code}: {finished.output}"
    assert finished.seconds < grace, f"{name} took {finished.seconds:.1f} s of {grace} s"
    return finished.seconds
