"""The machine and the versions the figures were measured with."""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from bench import db
from service.adapters.amqp.management import Management

PACKAGES = ("aio-pika", "aiormq", "asyncpg")


@dataclass(frozen=True)
class Machine:
    """Where and with what the benchmark ran."""

    cpu: str
    cores: int
    memory_gb: float
    system: str
    python: str
    postgresql: str
    rabbitmq: str
    erlang: str
    packages: dict[str, str]
    load_average: float  # 1-minute, at the start: other work on the machine skews the figures

    def lines(self) -> list[str]:
        """Human-readable, one fact per line."""
        packages = ", ".join(f"{name} {version}" for name, version in self.packages.items())
        return [
            f"  machine     {self.cpu}, {self.cores} cores, {self.memory_gb:.0f} GB, {self.system}",
            f"  versions    Python {self.python}, PostgreSQL {self.postgresql}, "
            f"RabbitMQ {self.rabbitmq} (Erlang {self.erlang}), {packages}",
            f"  load        1-minute load average {self.load_average:.2f} at the start",
        ]

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def memory_gb() -> float:
    """Total memory from ``/proc/meminfo``."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return 0.0


async def describe(conn: db.Connection, management: Management) -> Machine:
    """Collect the facts (the servers' versions from the servers themselves)."""
    postgresql: str = await conn.fetchval("SHOW server_version")
    overview = await management.request("GET", "/overview")
    return Machine(
        cpu=cpu_model(),
        cores=os.cpu_count() or 0,
        memory_gb=memory_gb(),
        system=f"{platform.system()} {platform.release()}",
        python=platform.python_version(),
        postgresql=postgresql.split()[0],
        rabbitmq=str(overview.get("rabbitmq_version", "?")),
        erlang=str(overview.get("erlang_version", "?")),
        packages={name: metadata.version(name) for name in PACKAGES},
        load_average=os.getloadavg()[0],
    )
