"""``python -m service.declare``: declare the topology; the deploy's step, like migrate.

Declaring needs the configure permission, which the running processes do not
have: the deploy runs this once, with a user that may configure, before the
consumers and the scan start. It is idempotent; a queue or exchange found
declared otherwise stops it with one line (``TopologyMismatch``).

What the running processes do instead, changing nothing, is
``service.adapters.amqp.declaring.check_topology``.
"""

from __future__ import annotations

import argparse
import logging

from service.adapters import amqp
from service.adapters.amqp.declaring import declare_topology, topology_for
from service.cli import run_command
from service.core.topology import DECLARE_COMMAND, Topology
from service.settings import Settings

log = logging.getLogger("service.declare")


async def declare(settings: Settings) -> Topology:
    """Declare every exchange, queue and binding for ``settings`` (idempotent)."""
    topology = topology_for(settings)
    connection = await amqp.connect(settings, name=f"expiry-declare {settings.worker_id}")
    try:
        channel = await connection.channel(publisher_confirms=False)
        await declare_topology(channel, topology)
        await channel.close()
    finally:
        await connection.close()
    log.info(
        "topology.declared",
        extra={"exchanges": len(topology.exchanges), "queues": len(topology.queues)},
    )
    return topology


async def _main(settings: Settings, _args: argparse.Namespace) -> int:
    topology = await declare(settings)
    print(
        f"topology declared: {len(topology.exchanges)} exchange(s), "
        f"{len(topology.queues)} queue(s), all as expected"
    )
    return 0


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(
        prog=DECLARE_COMMAND,
        description=(
            "Declare the exchanges, queues and bindings the service uses (idempotent; needs a "
            "RabbitMQ user that may configure them). Run by the deploy before the consumers "
            "and the scan, which only check them. Exit 1 with one line if one exists with "
            "other settings."
        ),
    )
    run_command(parser, _main)


if __name__ == "__main__":
    main()
