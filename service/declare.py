"""``python -m service.declare``: declare the topology; the deploy's step, like migrate.

Declaring needs the configure permission, which the running processes do not
have: the deploy runs this once, with a user that may configure, before the
consumers and the scan start. It is idempotent; a queue or exchange found
declared otherwise stops it with one line (``TopologyMismatch``).

``check_topology`` is what the running processes do instead: it changes
nothing. Every exchange and queue must exist (passive declares, no permission
needed); their arguments and bindings are read from the management API and
compared with ``build_topology``. When that API cannot be read, one warning
says so and the check stops at existence: a consumer does not depend on the
management plugin to run.
"""

from __future__ import annotations

import argparse
import logging

from aio_pika.abc import AbstractConnection

from service import broker, management
from service.cli import run_command
from service.errors import TopologyMismatch
from service.redaction import redact
from service.settings import Settings
from service.topology import (
    DECLARE_COMMAND,
    Topology,
    build_topology,
    declare_topology,
    require_topology,
)

log = logging.getLogger("service.declare")


async def declare(settings: Settings) -> Topology:
    """Declare every exchange, queue and binding for ``settings`` (idempotent)."""
    topology = build_topology(settings.retry_delays)
    connection = await broker.connect(settings, name=f"expiry-declare {settings.worker_id}")
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


async def check_topology(connection: AbstractConnection, settings: Settings) -> None:
    """Check the topology without changing it; ``TopologyMismatch`` (one line) if it differs."""
    topology = build_topology(settings.retry_delays)
    await require_topology(connection, topology)
    endpoint = management.endpoint_for(settings)
    try:
        observed = await management.read_observed(endpoint)
    except management.ManagementUnavailable as exc:
        log.warning(
            "topology.arguments_unchecked",
            extra={"management_url": redact(endpoint.base), "reason": redact(str(exc))},
        )
        return
    found = management.drift(topology, observed)
    if found is not None:
        raise TopologyMismatch(
            f"{found.what} exists on the broker with other settings "
            f"({'; '.join(found.details)}); delete it and run {DECLARE_COMMAND}, then start again"
        )
    log.debug("topology.checked", extra={"queues": len(topology.queues)})


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
