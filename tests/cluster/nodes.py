"""A private three-node RabbitMQ cluster of the machine's ``rabbitmq-server``.

Each node is a private node (``tests/rabbitnode.py``: its own node name and
ports on 127.0.0.1, its own home, data and log folders under one temporary
folder); all share one Erlang cookie. Nodes 2 and 3 join node 1 with
``rabbitmqctl join_cluster``. ``shutdown()`` stops every node, kills what is
left of it and removes its folders, whatever happened before.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.rabbitnode import (
    PORTS_PER_NODE,
    STARTUP_SECONDS,
    RabbitNode,
    ServerUnavailable,
    free_port_block,
    rabbitmq_scripts,
)

LETTERS = "ABC"


# What a node does when it finds itself in a minority of the cluster (as
# rabbitmq/cluster.conf sets it for compose's cluster): it pauses, closing its
# clients' connections, until it sees a majority again.
PARTITION_HANDLING = "cluster_partition_handling = pause_minority\n"


class ClusterNode(RabbitNode):
    """One node of the private cluster: a private node that can join and come back, and be
    cut off from its peers."""

    def _write_files(self) -> None:
        fresh = not (self.home / ".erlang.cookie").exists()
        super()._write_files()
        if fresh:
            with (self.home / "rabbitmq.conf").open("a") as conf:
                conf.write(PARTITION_HANDLING)

    def isolate(self, peers: list[ClusterNode]) -> None:
        """A partition between this node and ``peers``: the distribution links are cut and
        cannot come back (this node offers them a cookie they do not have), while each
        side stays up and reachable by its clients and by rabbitmqctl."""
        names = ",".join(f"'{peer.name}'" for peer in peers)
        self.ctl(
            "eval",
            f"[begin erlang:set_cookie(N, 'partitioned'), erlang:disconnect_node(N) end"
            f" || N <- [{names}]], ok.",
        )

    def heal(self, peers: list[ClusterNode]) -> None:
        """End the partition: the real cookie again, and a ping to each peer."""
        names = ",".join(f"'{peer.name}'" for peer in peers)
        self.ctl(
            "eval",
            f"[begin erlang:set_cookie(N, erlang:get_cookie()), net_adm:ping(N) end"
            f" || N <- [{names}]], ok.",
        )

    def join(self, first: ClusterNode) -> None:
        """Join ``first``'s cluster: stop_app, join_cluster, start_app, await_startup."""
        self.ctl("stop_app")
        self.ctl("join_cluster", first.name)
        self.ctl("start_app")
        self.ctl("await_startup", "--timeout", "120", timeout=150)

    def restore(self, deadline: float) -> None:
        """Bring the node back (start its application, or boot it again if it was killed)."""
        if self.process is None or self.process.poll() is not None:
            self.launch()
        else:
            self.ctl("start_app", timeout=150)
        self.await_booted(deadline)
        self.await_management(deadline)


@dataclass
class RabbitCluster:
    """Three nodes joined into one cluster: ``start()``, ``node(name)``, ``shutdown()``."""

    nodes: tuple[ClusterNode, ...]

    def start(self) -> None:
        """Boot every node at once, join the others to the first, check the membership."""
        deadline = time.monotonic() + STARTUP_SECONDS
        for node in self.nodes:
            node.launch()
        for node in self.nodes:
            node.await_booted(deadline)
        first, *others = self.nodes
        for node in others:
            node.join(first)
        for node in self.nodes:
            node.await_management(deadline)
        running = self.running_nodes()
        if running != sorted(node.name for node in self.nodes):
            raise ServerUnavailable(f"the cluster runs {running}, not all three nodes")

    def restore(self) -> None:
        """Bring every stopped or killed node back, and check that all three run."""
        deadline = time.monotonic() + STARTUP_SECONDS
        down = set(self.nodes_down())
        for node in self.nodes:
            if node.name in down:
                node.restore(deadline)
        running = self.running_nodes()
        if running != sorted(node.name for node in self.nodes):
            raise ServerUnavailable(f"the cluster runs {running} after a restore")

    def running_nodes(self) -> list[str]:
        """The running nodes, by the management API of the first node that answers."""
        for node in self.nodes:
            with contextlib.suppress(httpx.HTTPError):
                response = httpx.get(
                    f"{node.management_url}/api/nodes", auth=("guest", "guest"), timeout=10
                )
                response.raise_for_status()
                return sorted(str(item["name"]) for item in response.json() if item["running"])
        raise ServerUnavailable("no node's management API answers")

    def nodes_down(self) -> list[str]:
        """The nodes that do not run."""
        running = self.running_nodes()
        return [node.name for node in self.nodes if node.name not in running]

    def node(self, name: str) -> ClusterNode:
        """The node called ``name``."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def amqp_url(self, vhost: str = "/") -> str:
        """``AMQP_URL`` naming every node, comma-separated, in order."""
        return ",".join(node.amqp_url(vhost) for node in self.nodes)

    def shutdown(self) -> None:
        """Shut every node down at once (each one even if another fails)."""
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            for done in [pool.submit(node.shutdown) for node in self.nodes]:
                with contextlib.suppress(Exception):
                    done.result()


def new_cluster(root: Path, size: int = 3) -> RabbitCluster:
    """A cluster of ``size`` nodes (not started) with homes under ``root``."""
    scripts = rabbitmq_scripts()
    base = free_port_block(PORTS_PER_NODE * size)
    cookie = secrets.token_hex(16).upper()
    run = secrets.token_hex(3)
    return RabbitCluster(
        tuple(
            ClusterNode(
                home=root / f"node{LETTERS[index]}",
                name=f"cluster{LETTERS[index]}-{run}@localhost",
                first_port=base + index * PORTS_PER_NODE,
                cookie=cookie,
                scripts=scripts,
            )
            for index in range(size)
        )
    )


@contextlib.contextmanager
def rabbit_cluster(root: Path) -> Iterator[RabbitCluster]:
    """A started three-node cluster, shut down and removed afterwards."""
    cluster = new_cluster(root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.shutdown()
