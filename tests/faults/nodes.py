"""Private servers for fault scenarios: a RabbitMQ node and a PostgreSQL cluster.

Both run on ports of their own, so a scenario can stop them without touching
the machine's broker or database. The RabbitMQ node gets its own home (with
its own Erlang cookie), data and log directories; the PostgreSQL cluster is a
``pg_createcluster`` cluster under a unique name. Both are torn down at the end.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import httpx

STARTUP_SECONDS = 120.0


class ServerUnavailable(RuntimeError):
    """A private server could not be set up on this machine."""


def port_is_free(port: int) -> bool:
    """Whether nothing listens on ``127.0.0.1:port`` (and we may bind it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_block(size: int, low: int = 20000, high: int = 60000) -> int:
    """The first port of ``size`` consecutive free ports (chosen at random)."""
    for _ in range(200):
        base = random.randrange(low, high - size)
        if all(port_is_free(base + offset) for offset in range(size)):
            return base
    raise ServerUnavailable(f"no block of {size} free ports between {low} and {high}")


def _run(
    args: list[str], *, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def _checked(result: subprocess.CompletedProcess[str], what: str) -> None:
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise ServerUnavailable(f"{what} failed (exit {result.returncode}): {' | '.join(detail)}")


def rabbitmq_scripts() -> Path:
    """The directory of the real ``rabbitmq-server`` and ``rabbitmqctl`` scripts.

    The ``/usr/sbin`` entries are a wrapper that switches to the ``rabbitmq``
    user (and its cookie); the scripts beside the wrapper run as we are.
    """
    found = shutil.which("rabbitmq-server")
    if found is None:
        raise ServerUnavailable("rabbitmq-server is not installed")
    folder = Path(found).resolve().parent
    if not (folder / "rabbitmqctl").exists():
        raise ServerUnavailable(f"no rabbitmqctl beside {folder}")
    return folder


@dataclass
class RabbitNode:
    """One private RabbitMQ node: ``start()``, ``stop_app()``, ``start_app()``, ``shutdown()``."""

    home: Path
    name: str = field(default_factory=lambda: f"faults{secrets.token_hex(4)}@localhost")
    amqp_port: int = 0
    management_port: int = 0
    process: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        base = free_port_block(15)
        self.amqp_port, self.management_port, self._dist_port = base, base + 1, base + 2
        self._ctl_ports = (base + 3, base + 14)
        self.scripts = rabbitmq_scripts()

    @property
    def env(self) -> dict[str, str]:
        """The environment of the node and of every ``rabbitmqctl`` aimed at it."""
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("RABBITMQ_", "ERL_"))
        }
        env.update(
            HOME=str(self.home),
            RABBITMQ_CONF_ENV_FILE=str(self.home / "rabbitmq-env.conf"),
            RABBITMQ_NODENAME=self.name,
            RABBITMQ_NODE_PORT=str(self.amqp_port),
            RABBITMQ_DIST_PORT=str(self._dist_port),
            RABBITMQ_MNESIA_BASE=str(self.home / "mnesia"),
            RABBITMQ_LOG_BASE=str(self.home / "log"),
            RABBITMQ_CONFIG_FILE=str(self.home / "rabbitmq.conf"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.home / "enabled_plugins"),
            RABBITMQ_PID_FILE=str(self.home / "node.pid"),
            RABBITMQ_CTL_DIST_PORT_MIN=str(self._ctl_ports[0]),
            RABBITMQ_CTL_DIST_PORT_MAX=str(self._ctl_ports[1]),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
            ERL_EPMD_ADDRESS="127.0.0.1",
        )
        return env

    def _write_files(self) -> None:
        for folder in ("mnesia", "log"):
            (self.home / folder).mkdir(parents=True, exist_ok=True)
        cookie = self.home / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16).upper())
        cookie.chmod(0o400)
        (self.home / "rabbitmq-env.conf").write_text("ERL_EPMD_ADDRESS=127.0.0.1\n")
        (self.home / "enabled_plugins").write_text("[rabbitmq_management].\n")
        (self.home / "rabbitmq.conf").write_text(
            f"listeners.tcp.local = 127.0.0.1:{self.amqp_port}\n"
            f"management.tcp.ip = 127.0.0.1\n"
            f"management.tcp.port = {self.management_port}\n"
            "collect_statistics_interval = 500\n"
        )

    def start(self) -> None:
        """Boot the node and wait until it and its management API answer."""
        self._write_files()
        with (self.home / "server.out").open("ab") as out:
            self.process = subprocess.Popen(
                [str(self.scripts / "rabbitmq-server")],
                env=self.env,
                cwd=self.home,
                stdout=out,
                stderr=out,
                start_new_session=True,
            )
        deadline = time.monotonic() + STARTUP_SECONDS
        while not self._booted():
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = (self.home / "server.out").read_text(errors="replace")[-800:]
                raise ServerUnavailable(f"private RabbitMQ node did not boot: {tail}")
            time.sleep(0.5)
        self._await_management(deadline)

    def _booted(self) -> bool:
        result = self.ctl("await_startup", "--timeout", "30", check=False, timeout=60)
        return result.returncode == 0

    def _await_management(self, deadline: float) -> None:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                response = httpx.get(
                    f"{self.management_url}/api/overview", auth=("guest", "guest"), timeout=5
                )
                if response.status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise ServerUnavailable("the private node's management API did not answer")
            time.sleep(0.5)

    def ctl(
        self, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run ``rabbitmqctl -n <node> ...`` against this node."""
        result = _run(
            [str(self.scripts / "rabbitmqctl"), "-n", self.name, "-q", *args],
            env=self.env,
            timeout=timeout,
        )
        if check:
            _checked(result, f"rabbitmqctl {' '.join(args)}")
        return result

    def stop_app(self) -> None:
        """Stop the RabbitMQ application (the Erlang node keeps running)."""
        self.ctl("stop_app")

    def start_app(self) -> None:
        """Start the RabbitMQ application again and wait until it serves."""
        self.ctl("start_app")
        self.ctl("await_startup", "--timeout", "60")

    def shutdown(self) -> None:
        """Stop the node, kill what is left of it, and remove its directories."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.ctl("stop", check=False, timeout=60)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)
        shutil.rmtree(self.home, ignore_errors=True)

    def amqp_url(self, vhost: str, port: int | None = None) -> str:
        """The AMQP URL of ``vhost`` on this node (through ``port`` if given)."""
        return f"amqp://guest:guest@127.0.0.1:{port or self.amqp_port}/{quote(vhost, safe='')}"

    @property
    def management_url(self) -> str:
        """The management API's base URL."""
        return f"http://127.0.0.1:{self.management_port}"


@contextlib.contextmanager
def private_rabbit_node(home: Path) -> Iterator[RabbitNode]:
    """A started private node, shut down and removed afterwards."""
    node = RabbitNode(home)
    try:
        node.start()
        yield node
    finally:
        node.shutdown()


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
    created: bool = False

    def _ctl(self, action: str, *extra: str) -> None:
        result = _run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", self.version, self.name, action, *extra]
        )
        _checked(result, f"pg_ctlcluster {self.version} {self.name} {action}")

    def create(self) -> None:
        """Create the cluster (trust auth, listening on localhost:port) and start it."""
        result = _run(
            [
                "pg_createcluster",
                self.version,
                self.name,
                "--port",
                str(self.port),
                "-o",
                "max_connections=200",
                "--",
                "--auth=trust",
            ]
        )
        _checked(result, "pg_createcluster")
        self.created = True
        self.start()

    def start(self) -> None:
        """Start the cluster and wait until it accepts connections."""
        self._ctl("start")
        deadline = time.monotonic() + STARTUP_SECONDS
        while _run(["pg_isready", "-q", "-h", "127.0.0.1", "-p", str(self.port)]).returncode:
            if time.monotonic() > deadline:
                raise ServerUnavailable(f"private PostgreSQL cluster {self.name} did not start")
            time.sleep(0.2)

    def stop(self, mode: str = "fast") -> None:
        """Stop the cluster (``fast``: sessions are terminated, like a restart)."""
        self._ctl("stop", "-m", mode)

    def is_running(self) -> bool:
        """Whether the cluster accepts connections."""
        return _run(["pg_isready", "-q", "-h", "127.0.0.1", "-p", str(self.port)]).returncode == 0

    def drop(self) -> None:
        """Stop and remove the cluster."""
        if self.created:
            _run(["pg_dropcluster", self.version, self.name, "--stop"])
            self.created = False

    @property
    def admin_url(self) -> str:
        """A maintenance DSN of the cluster."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"


@contextlib.contextmanager
def private_pg_cluster() -> Iterator[PgCluster]:
    """A created, started private cluster, dropped afterwards."""
    cluster = PgCluster()
    try:
        cluster.create()
        yield cluster
    finally:
        cluster.drop()
