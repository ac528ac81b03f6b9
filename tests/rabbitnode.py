"""A private RabbitMQ node of the machine's ``rabbitmq-server``, for the fault suite
and the cluster test.

A node has its own node name and its own AMQP, management and distribution
ports on 127.0.0.1 (a block of ``PORTS_PER_NODE`` from ``first_port`` on:
AMQP, management, distribution, then rabbitmqctl's own range), and its own
home, data and log folders; its Erlang cookie is written into its home, so
that the machine's ``rabbitmqctl`` aimed at it uses it too. ``shutdown()``
stops it, kills what is left of it and removes its folders, whatever
happened before.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import quote, urlsplit

import httpx

STARTUP_SECONDS = 180.0
PORTS_PER_NODE = 15
MANAGEMENT_OFFSET = 1  # a node's management port follows its AMQP port


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


def free_port_block(size: int, low: int = 20000, high: int = 32000) -> int:
    """The first port of ``size`` consecutive free ports (chosen at random).

    Below Linux's ephemeral range (32768-60999), so that no outgoing connection
    of another process takes one of them between the choice and the bind.
    """
    for _ in range(200):
        base = random.randrange(low, high - size)
        if all(port_is_free(base + offset) for offset in range(size)):
            return base
    raise ServerUnavailable(f"no block of {size} free ports between {low} and {high}")


def run(
    args: list[str], *, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing its output; never raises on its exit status."""
    return subprocess.run(
        args, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def checked(result: subprocess.CompletedProcess[str], what: str) -> None:
    """Raise ``ServerUnavailable`` with the end of its output if ``result`` failed."""
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


class NodeBasics:
    """What every node of the tests does the same way, given its ``ctl``, ``amqp_port``
    and ``management_port``."""

    @property
    def amqp_port(self) -> int:
        raise NotImplementedError

    @property
    def management_port(self) -> int:
        raise NotImplementedError

    def ctl(
        self, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        raise NotImplementedError

    def stop_app(self) -> None:
        """Stop the RabbitMQ application (the Erlang node keeps running)."""
        self.ctl("stop_app")

    def start_app(self) -> None:
        """Start the RabbitMQ application again and wait until it serves."""
        self.ctl("start_app")
        self.ctl("await_startup", "--timeout", "60")

    def amqp_url(self, vhost: str = "/", port: int | None = None) -> str:
        """The AMQP URL of ``vhost`` on this node (through ``port`` if given)."""
        return f"amqp://guest:guest@127.0.0.1:{port or self.amqp_port}/{quote(vhost, safe='')}"

    @property
    def management_url(self) -> str:
        """The management API's base URL."""
        return f"http://127.0.0.1:{self.management_port}"

    def await_management(self, deadline: float) -> None:
        """Wait until the node's management API answers."""
        while True:
            with contextlib.suppress(httpx.HTTPError):
                response = httpx.get(
                    f"{self.management_url}/api/overview", auth=("guest", "guest"), timeout=5
                )
                if response.status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise ServerUnavailable(f"the management API at {self.management_url} is silent")
            time.sleep(0.5)


@dataclass
class RabbitNode(NodeBasics):
    """One private node, on the ports from ``first_port`` on."""

    home: Path
    name: str
    first_port: int
    cookie: str
    scripts: Path
    process: subprocess.Popen[bytes] | None = None

    @classmethod
    def alone(cls, home: Path, prefix: str = "faults") -> RabbitNode:
        """A node of its own (own ports, own cookie), not started."""
        return cls(
            home=home,
            name=f"{prefix}{secrets.token_hex(4)}@localhost",
            first_port=free_port_block(PORTS_PER_NODE),
            cookie=secrets.token_hex(16).upper(),
            scripts=rabbitmq_scripts(),
        )

    @property
    def amqp_port(self) -> int:
        """The AMQP listener's port."""
        return self.first_port

    @property
    def management_port(self) -> int:
        """The management API's port."""
        return self.first_port + MANAGEMENT_OFFSET

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
            RABBITMQ_DIST_PORT=str(self.first_port + 2),
            RABBITMQ_MNESIA_BASE=str(self.home / "mnesia"),
            RABBITMQ_LOG_BASE=str(self.home / "log"),
            RABBITMQ_CONFIG_FILE=str(self.home / "rabbitmq.conf"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.home / "enabled_plugins"),
            RABBITMQ_PID_FILE=str(self.home / "node.pid"),
            RABBITMQ_CTL_DIST_PORT_MIN=str(self.first_port + 3),
            RABBITMQ_CTL_DIST_PORT_MAX=str(self.first_port + PORTS_PER_NODE - 1),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
            ERL_EPMD_ADDRESS="127.0.0.1",
        )
        return env

    def _write_files(self) -> None:
        if (self.home / ".erlang.cookie").exists():
            return  # a restart: the node keeps its files and its data
        for folder in ("mnesia", "log"):
            (self.home / folder).mkdir(parents=True, exist_ok=True)
        cookie = self.home / ".erlang.cookie"
        cookie.write_text(self.cookie)
        cookie.chmod(0o400)
        (self.home / "rabbitmq-env.conf").write_text("ERL_EPMD_ADDRESS=127.0.0.1\n")
        (self.home / "enabled_plugins").write_text("[rabbitmq_management].\n")
        (self.home / "rabbitmq.conf").write_text(
            f"listeners.tcp.local = 127.0.0.1:{self.amqp_port}\n"
            "management.tcp.ip = 127.0.0.1\n"
            f"management.tcp.port = {self.management_port}\n"
            "collect_statistics_interval = 500\n"
        )

    def start(self) -> None:
        """Boot the node and wait until it and its management API answer."""
        deadline = time.monotonic() + STARTUP_SECONDS
        self.launch()
        self.await_booted(deadline)
        self.await_management(deadline)

    def launch(self) -> None:
        """Start the node's ``rabbitmq-server`` in a session of its own (no waiting)."""
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

    def await_booted(self, deadline: float) -> None:
        """Wait until the node has booted (``rabbitmqctl await_startup``)."""
        while self.ctl("await_startup", "--timeout", "30", check=False, timeout=60).returncode:
            exited = self.process is None or self.process.poll() is not None
            if exited or time.monotonic() > deadline:
                raise ServerUnavailable(f"node {self.name} did not boot: {self.log_tail()}")
            time.sleep(0.5)

    def log_tail(self, size: int = 1500) -> str:
        """The end of the node's own log (where a failed listener says why)."""
        log = self.home / "log" / f"{self.name}.log"
        source = log if log.exists() else self.home / "server.out"
        return source.read_text(errors="replace")[-size:] if source.exists() else "(no log)"

    def ctl(
        self, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run ``rabbitmqctl -n <node> -q ...`` against this node."""
        result = run(
            [str(self.scripts / "rabbitmqctl"), "-n", self.name, "-q", *args],
            env=self.env,
            timeout=timeout,
        )
        if check:
            checked(result, f"rabbitmqctl -n {self.name} {' '.join(args)}")
        return result

    def kill(self) -> None:
        """SIGKILL the node's whole session: the Erlang VM dies without a goodbye."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=30)

    def shutdown(self) -> None:
        """Stop the node, kill whatever is left of its session, remove its folders."""
        if self.process is not None:
            if self.process.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.ctl("stop", check=False, timeout=60)
            self.kill()
        shutil.rmtree(self.home, ignore_errors=True)


def management_url_beside(amqp_url: str) -> str:
    """The management API of the private node whose AMQP URL is ``amqp_url`` (the first of
    a list), without credentials (a service logs in with its AMQP user)."""
    parts = urlsplit(amqp_url.split(",")[0])
    return f"http://{parts.hostname}:{(parts.port or 5672) + MANAGEMENT_OFFSET}"


class FaultNode(Protocol):
    """What the fault suite needs of its broker node: where it is, and its app stopped,
    started and told things (``rabbitmqctl``)."""

    @property
    def amqp_port(self) -> int: ...

    @property
    def management_url(self) -> str: ...

    def amqp_url(self, vhost: str = "/", port: int | None = None) -> str: ...

    def ctl(
        self, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]: ...

    def stop_app(self) -> None: ...

    def start_app(self) -> None: ...

    def shutdown(self) -> None: ...


RABBITMQ4_SCRIPT = Path(__file__).resolve().parents[1].parent / "shared" / "tools" / "rabbitmq4.sh"


@dataclass
class Rabbitmq4Node(NodeBasics):
    """The RabbitMQ 4.x node of ``../shared/tools/rabbitmq4.sh`` (``rmq4@localhost``: AMQP
    5673, management 15673), for the fault suite's leg on 4.x. The script owns the node:
    it is started if down, its app stopped and started for the scenarios, and left
    running at the end."""

    script: Path = RABBITMQ4_SCRIPT

    @property
    def amqp_port(self) -> int:
        """The node's AMQP port (rabbitmq4.sh's)."""
        return 5673

    @property
    def management_port(self) -> int:
        """Its management API's port."""
        return 15673

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return run(["bash", str(self.script), *args], timeout=timeout)

    def start(self) -> None:
        """Start the node (or its app) if it is not running, and wait for its API."""
        if not self.script.exists():
            raise ServerUnavailable(f"{self.script} is missing")
        if self._run("status").returncode != 0:
            checked(self._run("start", timeout=180), f"{self.script} start")
        self.await_management(time.monotonic() + STARTUP_SECONDS)

    def ctl(
        self, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """``rabbitmqctl ...`` against the node (through the script)."""
        result = self._run("ctl", *args, timeout=timeout)
        if check:
            checked(result, f"rabbitmq4.sh ctl {' '.join(args)}")
        return result

    def shutdown(self) -> None:
        """Leave the node as found: its app running (the script's other users expect it)."""
        if self._run("status").returncode != 0:
            self._run("start", timeout=180)
