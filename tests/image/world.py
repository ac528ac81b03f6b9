"""One image test's world: its database and vhost, each command's settings as the
deployment gives them (a role and a user of its own), and the checks of the outcome."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from tests.image.containers import Containers
from tests.support import as_role, pg_connection, transitions_per_reservation

# What the image tests did, printed at the end of the session (conftest.py).
FIGURES: list[str] = []

# The database roles of migration 0005 (docs/reference.md, "Database roles").
CONSUMER_ROLE = "expiry_consumer"
SCAN_ROLE = "expiry_scan"
OPERATOR_ROLE = "expiry_operator"

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

    async def expired(self) -> int:
        """Holds expired so far."""
        async with pg_connection(self.database_url) as conn:
            count: int = await conn.fetchval(
                "SELECT count(*) FROM reservations WHERE status = 'expired'"
            )
        return count

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
