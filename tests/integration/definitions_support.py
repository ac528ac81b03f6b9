"""Helpers for the tests of ``rabbitmq/``: the shipped definitions, users, a throwaway node."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from tests.support import RUN_ID, Management, free_port

RABBITMQ_DIR = Path(__file__).resolve().parents[2] / "rabbitmq"
DEFINITIONS = RABBITMQ_DIR / "definitions.json"
# One user per job: the deploy declares, the scan publishes, the consumers consume,
# the operator replays dead letters, the relay publishes events; admin is the management
# UI's.
DEPLOY_USER = "expiry-deploy"
CONSUMER_USER = "expiry-consumer"
SCAN_USER = "expiry-scan"
OPERATOR_USER = "expiry-operator"
RELAY_USER = "expiry-relay"
SERVICE_USERS = (DEPLOY_USER, CONSUMER_USER, SCAN_USER, OPERATOR_USER, RELAY_USER)
ADMIN_USER = "admin"
# The documented throwaway passwords of the shipped definitions (compose.yaml uses them).
THROWAWAY_PASSWORDS = {
    **{user: f"{user}-change-me" for user in SERVICE_USERS},
    ADMIN_USER: "admin-change-me",
}
SHA256 = "rabbit_password_hashing_sha256"
# Objects of one vhost that the broker makes itself, not the service.
_BUILTIN_EXCHANGE = re.compile(r"^(|amq\..*)$")


def load_definitions() -> dict[str, Any]:
    """``rabbitmq/definitions.json``."""
    result: dict[str, Any] = json.loads(DEFINITIONS.read_text())
    return result


def for_vhost_import(definitions: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The vhost-scoped part (exchanges, queues, bindings, policies), without vhost fields."""
    return {
        kind: [{k: v for k, v in item.items() if k != "vhost"} for item in definitions[kind]]
        for kind in ("exchanges", "queues", "bindings", "policies")
    }


def permissions_of(definitions: dict[str, Any], user: str) -> dict[str, str]:
    """The configure/write/read patterns the definitions give ``user`` on ``/``."""
    [entry] = [p for p in definitions["permissions"] if p["user"] == user and p["vhost"] == "/"]
    return {key: entry[key] for key in ("configure", "write", "read")}


def tags_of(definitions: dict[str, Any], user: str) -> list[str]:
    """The tags the definitions give ``user``."""
    [entry] = [u for u in definitions["users"] if u["name"] == user]
    return list(entry["tags"])


def permits(pattern: str, name: str) -> bool:
    """Whether a permission pattern covers ``name`` (RabbitMQ: an empty one covers nothing)."""
    return pattern != "" and re.search(pattern, name) is not None


def rabbit_password_hash(password: str, salt: bytes) -> str:
    """RabbitMQ's ``rabbit_password_hashing_sha256``: base64(salt + sha256(salt + password))."""
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def salt_of(password_hash: str) -> bytes:
    """The 4-byte salt at the front of a RabbitMQ password hash."""
    return base64.b64decode(password_hash)[:4]


def policy_conflicts(definitions: dict[str, Any]) -> list[str]:
    """Policy keys that disagree with the ``x-`` argument of a queue the policy matches."""
    conflicts: list[str] = []
    for policy in definitions["policies"]:
        if policy.get("apply-to", "all") not in ("all", "queues"):
            continue
        pattern = re.compile(policy["pattern"])
        for queue in definitions["queues"]:
            if not pattern.search(queue["name"]):
                continue
            for key, value in policy["definition"].items():
                declared = queue["arguments"].get(f"x-{key}")
                if declared is not None and declared != value:
                    conflicts.append(f"{policy['name']}: {key}={value!r} on {queue['name']}")
    return conflicts


def with_credentials(url: str, user: str, password: str) -> str:
    """``url`` with another user and password."""
    parts = urlsplit(url)
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{parts.hostname}"
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


class BrokerAdmin(Management):
    """The management API calls of these tests, beside the shared ones."""

    @classmethod
    def like(cls, management: Management) -> BrokerAdmin:
        """An admin client with the same endpoint and credentials."""
        return cls(management.base, user=management.user, password=management.password)

    async def import_definitions(self, vhost: str, body: dict[str, Any]) -> None:
        """Import vhost-scoped definitions into ``vhost``."""
        await self.request("POST", f"/definitions/{quote(vhost, safe='')}", body)

    async def queue_arguments(self, vhost: str) -> dict[str, dict[str, Any]]:
        """Each queue's arguments, by name."""
        return {q["name"]: q["arguments"] for q in await self.queues(vhost)}

    async def exchange_names(self, vhost: str) -> set[str]:
        """The exchanges of ``vhost`` that are not the broker's own."""
        found = await self.request("GET", f"/exchanges/{quote(vhost, safe='')}")
        return {e["name"] for e in found if not _BUILTIN_EXCHANGE.match(e["name"])}

    async def bindings(self, vhost: str) -> set[tuple[str, str, str]]:
        """(source, destination, routing key) of every binding but the default ones."""
        found = await self.request("GET", f"/bindings/{quote(vhost, safe='')}")
        return {(b["source"], b["destination"], b["routing_key"]) for b in found if b["source"]}

    async def create_user(self, name: str, *, tags: str = "", **credentials: str) -> None:
        """``credentials``: ``password=...``, or ``password_hash=...`` and ``hashing_algorithm``;
        ``tags`` comma-separated."""
        body = {"tags": tags, **credentials}
        await self.request("PUT", f"/users/{quote(name, safe='')}", body)

    async def delete_user(self, name: str) -> None:
        """Delete user ``name``."""
        await self.request("DELETE", f"/users/{quote(name, safe='')}")


@contextlib.asynccontextmanager
async def users_like_shipped(
    admin: BrokerAdmin, vhost: str, amqp_url: str
) -> AsyncIterator[dict[str, str]]:
    """For each service user of the shipped definitions, a test user with its tags and its
    permissions (in ``vhost``) and a test password; yields the shipped name -> its test
    user's ``amqp_url``. The users are deleted afterwards."""
    shipped = load_definitions()
    urls: dict[str, str] = {}
    created: list[str] = []
    try:
        for user in SERVICE_USERS:
            name, password = f"{user}-t-{RUN_ID}-{secrets.token_hex(3)}", secrets.token_urlsafe(18)
            await admin.create_user(name, password=password, tags=",".join(tags_of(shipped, user)))
            created.append(name)
            await admin.set_permissions(vhost, name, permissions_of(shipped, user))
            urls[user] = with_credentials(amqp_url, name, password)
        yield urls
    finally:
        for name in created:
            await admin.delete_user(name)


def shipped_bindings(definitions: dict[str, Any]) -> set[tuple[str, str, str]]:
    """(source, destination, routing key) of every shipped binding."""
    return {(b["source"], b["destination"], b["routing_key"]) for b in definitions["bindings"]}


@dataclass(frozen=True)
class Node:
    """A throwaway RabbitMQ node booted from the shipped ``rabbitmq/`` files."""

    name: str
    amqp_port: int
    management_port: int
    prometheus_port: int
    home: Path

    def environment(self) -> str:
        """The node's application environment (``rabbitmqctl environment``)."""
        return _ctl(self.name, "environment").stdout

    @property
    def log(self) -> str:
        logs = sorted((self.home / "log").glob("*.log"))
        return "\n".join(path.read_text(errors="replace")[-3000:] for path in logs)


def _ctl(node: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["rabbitmqctl", "-n", node, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _node_files(home: Path, node: Node) -> dict[str, str]:
    """Copy the shipped files unchanged; put only paths and ports in a conf.d override."""
    for sub in ("conf.d", "data", "log"):
        (home / sub).mkdir()
    for name in ("rabbitmq.conf", "definitions.json", "enabled_plugins"):
        shutil.copyfile(RABBITMQ_DIR / name, home / name)
    (home / "conf.d" / "99-test-node.conf").write_text(
        f"load_definitions = {home / 'definitions.json'}\n"
        f"listeners.tcp.default = 127.0.0.1:{node.amqp_port}\n"
        f"management.tcp.ip = 127.0.0.1\nmanagement.tcp.port = {node.management_port}\n"
        f"prometheus.tcp.ip = 127.0.0.1\nprometheus.tcp.port = {node.prometheus_port}\n"
    )
    for path in (home, *home.rglob("*")):  # the node runs as the rabbitmq user
        path.chmod(0o777 if path.is_dir() else 0o644)
    return {
        "RABBITMQ_NODENAME": node.name,
        "RABBITMQ_DIST_PORT": str(free_port()),
        "RABBITMQ_CONFIG_FILE": str(home / "rabbitmq.conf"),
        "RABBITMQ_CONFIG_FILES": str(home / "conf.d"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(home / "enabled_plugins"),
        "RABBITMQ_MNESIA_BASE": str(home / "data"),
        "RABBITMQ_LOG_BASE": str(home / "log"),
        "RABBITMQ_PID_FILE": str(home / "node.pid"),
    }


@contextlib.contextmanager
def throwaway_node() -> Iterator[Node]:
    """Boot a second local node from the shipped files (loopback ports only); stop it after."""
    home = Path(tempfile.mkdtemp(prefix=f"expiry-node-{RUN_ID}-"))
    node = Node(
        name=f"expiry-test-{RUN_ID}@localhost",
        amqp_port=free_port(),
        management_port=free_port(),
        prometheus_port=free_port(),
        home=home,
    )
    env = {**os.environ, **_node_files(home, node)}
    try:
        subprocess.run(["rabbitmq-server", "-detached"], env=env, check=True, timeout=60)
        _await_startup(node)
        yield node
    finally:
        _stop(node)
        shutil.rmtree(home, ignore_errors=True)


def _await_startup(node: Node, timeout: float = 120) -> None:
    """Wait for a node started with ``-detached`` (it registers with epmd a moment later)."""
    deadline = time.monotonic() + timeout
    while True:
        started = _ctl(node.name, "await_startup", "--timeout", str(int(timeout)), timeout=timeout)
        if started.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"node did not boot: {started.stderr}\n{node.log}")
        time.sleep(1)


def _stop(node: Node, timeout: float = 30) -> None:
    """Stop the node; if it does not answer, kill the process it recorded."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _ctl(node.name, "stop").returncode == 0:
            return
        pid_file = node.home / "node.pid"
        if pid_file.exists():
            with contextlib.suppress(OSError, ValueError):  # already gone
                os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
            return
        time.sleep(1)
