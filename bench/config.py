"""Where the services are, and what one run measures (from the command line)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from service.adapters.amqp.management import url_beside

DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Endpoints:
    """The servers' admin endpoints; the benchmark creates its database and vhost beside them."""

    database_url: str
    amqp_url: str
    management_url: str


def endpoints_from(env: Mapping[str, str]) -> Endpoints:
    """``DATABASE_URL``, ``AMQP_URL`` (its first node), ``RABBITMQ_MANAGEMENT_URL``; or defaults."""
    amqp_url = (env.get("AMQP_URL") or DEFAULT_AMQP_URL).split(",")[0].strip()
    return Endpoints(
        database_url=env.get("DATABASE_URL") or DEFAULT_DATABASE_URL,
        amqp_url=amqp_url,
        management_url=env.get("RABBITMQ_MANAGEMENT_URL") or url_beside(amqp_url),
    )


# What --only may name (the raw limits always run: every ratio needs them).
PHASES = (
    "backlog",
    "metrics",
    "per-message",
    "peer",
    "traced",
    "production",
    "locked",
    "sustained",
    "capacity",
    "scanners",
    "events",
    "relay",
    "events-latency",
    "webhooks",
    "pooler",
    "scan-memory",
)


@dataclass(frozen=True)
class Options:
    """The sizes of one run."""

    holds: int  # due holds per backlog run (scan, consume, raw limits)
    repeat: int
    consumers: tuple[int, ...]  # consumer processes of the batched runs
    rate: int  # sustained run: holds due per second
    duration: float  # sustained run: seconds over which they come due
    scan_holds: int  # the scan's memory run
    scan_every: float  # sustained run: the scan interval
    quick: bool
    json_path: Path | None
    overrides: tuple[tuple[str, str], ...] = ()  # EXPIRY_* settings for every service process
    only: tuple[str, ...] = ()  # the phases to run (empty: all); the limits always run
    relays: int = 1  # relays of the events' phases that run one beside the consumers

    def runs(self, phase: str) -> bool:
        """Whether ``phase`` (one of ``PHASES``) is measured in this run."""
        return not self.only or phase in self.only

    @property
    def sustained_consumers(self) -> int:
        return max(self.consumers)
