"""Private servers for fault scenarios: a RabbitMQ node and a PostgreSQL cluster.

Both run on ports of their own, so a scenario can stop them without touching
the machine's broker or database. The RabbitMQ node (``tests/rabbitnode.py``,
shared with the cluster test) gets its own home (with its own Erlang cookie),
data and log directories; the PostgreSQL cluster is a ``pg_createcluster``
cluster under a unique name. Both are torn down at the end.
"""

from __future__ import annotations

import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.rabbitnode import ServerUnavailable, checked, free_port_block, run

STARTUP_SECONDS = 120.0


def postgres_version() -> str:
    """The newest installed PostgreSQL major version (``/usr/lib/postgresql/<v>``)."""
    if shutil.which("pg_createcluster") is None or shutil.which("pg_ctlcluster") is None:
        raise ServerUnavailable("pg_createcluster / pg_ctlcluster (postgresql-common) missing")
    root = Path("/usr/lib/postgresql")
    versions = sorted(
        (p.name for p in root.iterdir() if p.name.isdigit()) if root.exists() else [],
        key=int,
    )
    if not versions:
        raise ServerUnavailable("no PostgreSQL server under /usr/lib/postgresql")
    return versions[-1]


@dataclass
class PgCluster:
    """A private PostgreSQL cluster: ``create()``, ``stop()``, ``start()``, ``drop()``."""

    name: str = field(default_factory=lambda: f"faults{secrets.token_hex(4)}")
    version: str = field(default_factory=postgres_version)
    port: int = field(default_factory=lambda: free_port_block(1))
    options: tuple[str, ...] = ()  # more postgresql.conf settings, "name=value"
    created: bool = False

    def _ctl(self, action: str, *extra: str) -> None:
        result = run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", self.version, self.name, action, *extra]
        )
        checked(result, f"pg_ctlcluster {self.version} {self.name} {action}")

    def create(self) -> None:
        """Create the cluster (trust auth, listening on localhost:port) and start it."""
        result = run(
            [
                "pg_createcluster",
                self.version,
                self.name,
                "--port",
                str(self.port),
                "-o",
                "max_connections=200",
                *(arg for option in self.options for arg in ("-o", option)),
                "--",
                "--auth=trust",
            ]
        )
        checked(result, "pg_createcluster")
        self.created = True
        self.start()

    def start(self) -> None:
        """Start the cluster and wait until it accepts connections."""
        self._ctl("start")
        deadline = time.monotonic() + STARTUP_SECONDS
        while run(["pg_isready", "-q", "-h", "127.0.0.1", "-p", str(self.port)]).returncode:
            if time.monotonic() > deadline:
                raise ServerUnavailable(f"private PostgreSQL cluster {self.name} did not start")
            time.sleep(0.2)

    @property
    def config_dir(self) -> Path:
        """Where its postgresql.conf and pg_hba.conf are (Debian's layout)."""
        return Path("/etc/postgresql") / self.version / self.name

    def reload(self) -> None:
        """Read the configuration files again (pg_hba.conf, the TLS files)."""
        self._ctl("reload")

    def stop(self, mode: str = "fast") -> None:
        """Stop the cluster (``fast``: sessions are terminated, like a restart)."""
        self._ctl("stop", "-m", mode)

    def is_running(self) -> bool:
        """Whether the cluster accepts connections."""
        return run(["pg_isready", "-q", "-h", "127.0.0.1", "-p", str(self.port)]).returncode == 0

    def drop(self) -> None:
        """Stop and remove the cluster."""
        if self.created:
            run(["pg_dropcluster", self.version, self.name, "--stop"])
            self.created = False

    def create_replica_of(self, primary: PgCluster) -> None:
        """Create this cluster as a streaming replica of ``primary`` (``pg_basebackup -R``,
        asynchronous, as a default set-up is) and start it."""
        # A standby needs max_connections at least the primary's (create() sets 200).
        create = ["pg_createcluster", self.version, self.name, "--port", str(self.port)]
        checked(
            run([*create, "-o", "max_connections=200", "--", "--auth=trust"]), "pg_createcluster"
        )
        self.created = True
        data = Path("/var/lib/postgresql") / self.version / self.name
        for entry in data.iterdir():
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        backup = [
            "runuser", "-u", "postgres", "--", "pg_basebackup", "-h", "127.0.0.1",
            "-p", str(primary.port), "-U", "postgres", "-D", str(data), "-R", "-X", "stream",
        ]  # fmt: skip
        checked(run(backup), "pg_basebackup")
        self.start()

    def promote(self) -> None:
        """Make this replica the primary (``pg_ctlcluster promote``)."""
        self._ctl("promote")

    @property
    def admin_url(self) -> str:
        """A maintenance DSN of the cluster."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
