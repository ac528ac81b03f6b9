"""``rabbitmq/`` against the real broker: the definitions, the service user, the config.

The shipped definitions are imported into a fresh vhost and the service is
started against them (it must declare nothing that conflicts); the service's
least-privilege user runs the service and can do nothing outside its names;
and the shipped ``rabbitmq.conf`` and ``enabled_plugins`` boot a node that
loads the definitions.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import shutil

import aio_pika
import aiormq.exceptions
import httpx
import pytest

from service import produce, topology
from service.settings import Settings
from tests.integration.definitions_support import (
    ADMIN_USER,
    SERVICE_USER,
    SHA256,
    THROWAWAY_PASSWORDS,
    BrokerAdmin,
    for_vhost_import,
    load_definitions,
    permissions_of,
    policy_conflicts,
    rabbit_password_hash,
    salt_of,
    shipped_bindings,
    throwaway_node,
    with_credentials,
)
from tests.support import (
    RUN_ID,
    Stack,
    eventually,
    insert_holds,
    missing,
    running_consumer,
    statuses,
    wait_for_consumers,
)

pytestmark = pytest.mark.integration

DEFAULT_DELAYS: tuple[int, ...] = Settings.model_fields["retry_delays"].default


def _default_topology(stack: Stack) -> Stack:
    """The stack with the default retry tiers: the ones the definitions are written for."""
    return stack.with_settings(retry_delays=DEFAULT_DELAYS)


async def _all_expired(stack: Stack, count: int) -> bool:
    return (await statuses(stack.database_url)).get("expired", 0) == count


async def test_imported_definitions_and_the_service_declare_the_same_topology(
    stack: Stack,
) -> None:
    """Import the shipped definitions, start scan and consumer: no mismatch, nothing added."""
    stack = _default_topology(stack)
    admin = BrokerAdmin.like(stack.management)
    shipped = load_definitions()
    await admin.import_definitions(stack.vhost, for_vhost_import(shipped))
    imported = await admin.queue_arguments(stack.vhost)
    assert imported == {q["name"]: q["arguments"] for q in shipped["queues"]}

    ids = await insert_holds(stack.database_url, 5)
    result = await produce.scan(stack.settings)  # declares the topology: no TopologyMismatch
    assert result.published == len(ids)
    async with running_consumer(stack.settings) as consumer:
        await wait_for_consumers(stack.amqp_url, 1, consumer)
        await eventually(lambda: _all_expired(stack, len(ids)))

    assert await admin.queue_arguments(stack.vhost) == imported
    declared = topology.build_topology(DEFAULT_DELAYS)
    assert await admin.exchange_names(stack.vhost) == {e.name for e in declared.exchanges}
    assert await admin.bindings(stack.vhost) == shipped_bindings(shipped)


def test_no_shipped_policy_disagrees_with_a_queue_argument() -> None:
    """A policy may only repeat what the queues declare (the shipped file has none)."""
    assert policy_conflicts(load_definitions()) == []


def test_shipped_password_hashes_are_of_the_documented_throwaway_passwords() -> None:
    """Each user's hash is RabbitMQ's salted SHA-256 of the password the README names."""
    for user in load_definitions()["users"]:
        assert user["hashing_algorithm"] == SHA256
        password = THROWAWAY_PASSWORDS[user["name"]]
        expected = rabbit_password_hash(password, salt_of(user["password_hash"]))
        assert user["password_hash"] == expected, user["name"]


def test_service_user_may_touch_only_the_service_names() -> None:
    """configure, write and read match exactly the names the service declares."""
    patterns = permissions_of(load_definitions(), SERVICE_USER)
    names = [q.name for q in topology.build_topology((1, 5, 30, 120, 3600)).queues]
    for kind, pattern in patterns.items():
        compiled = re.compile(pattern)
        for name in [*names, topology.RETRY_EXCHANGE, topology.DEAD_EXCHANGE]:
            assert compiled.search(name), (kind, name)
        for other in ("other", "amq.direct", "expirationsX", "x.expirations", "expirations."):
            assert not compiled.search(other), (kind, other)


async def test_least_privilege_user_runs_the_service_and_nothing_else(stack: Stack) -> None:
    """As the service user (shipped permissions, fresh vhost): scan and consume work; ACCESS_REFUSED
    for a queue or exchange outside its names."""
    admin = BrokerAdmin.like(stack.management)
    user, password = f"expiry-t-{RUN_ID}-{secrets.token_hex(4)}", secrets.token_urlsafe(18)
    await admin.create_user(user, password=password)
    try:
        await admin.set_permissions(
            stack.vhost, user, permissions_of(load_definitions(), SERVICE_USER)
        )
        amqp_url = with_credentials(stack.amqp_url, user, password)
        as_service = stack.with_settings(amqp_url=(amqp_url,))
        ids = await insert_holds(stack.database_url, 5)
        assert (await produce.scan(as_service.settings)).published == len(ids)
        async with running_consumer(as_service.settings) as consumer:
            await wait_for_consumers(stack.amqp_url, 1, consumer)
            await eventually(lambda: _all_expired(stack, len(ids)))
        await _refused_outside_its_names(amqp_url)
    finally:
        await admin.delete_user(user)


async def _refused_outside_its_names(amqp_url: str) -> None:
    connection = await aio_pika.connect(amqp_url)
    try:
        for name in ("not-expirations", "expirationsX", "x.expirations"):
            channel = await connection.channel()
            with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
                await channel.declare_queue(name, durable=True)
            channel = await connection.channel()
            with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
                await channel.declare_exchange(name, durable=True)
    finally:
        await connection.close()


async def test_broker_accepts_the_shipped_password_hash(stack: Stack) -> None:
    """A user made from the shipped hash logs in with the documented password."""
    admin = BrokerAdmin.like(stack.management)
    [shipped] = [u for u in load_definitions()["users"] if u["name"] == SERVICE_USER]
    user = f"expiry-hash-{RUN_ID}-{secrets.token_hex(4)}"
    await admin.create_user(user, password_hash=shipped["password_hash"], hashing_algorithm=SHA256)
    try:
        await admin.set_permissions(stack.vhost, user, {"configure": "", "write": "", "read": ""})
        url = with_credentials(stack.amqp_url, user, THROWAWAY_PASSWORDS[SERVICE_USER])
        connection = await aio_pika.connect(url)
        await connection.close()
        with pytest.raises(aio_pika.exceptions.ProbableAuthenticationError):
            await aio_pika.connect(with_credentials(stack.amqp_url, user, "wrong"))
    finally:
        await admin.delete_user(user)


@pytest.mark.private_broker
async def test_shipped_config_boots_a_node_that_loads_the_definitions(stack: Stack) -> None:
    """rabbitmq.conf + enabled_plugins + definitions.json, unchanged, boot a node: the
    definitions are loaded (no guest), the limits are set, the plugins answer, and the
    service user runs a scan and a consumer on it."""
    if shutil.which("rabbitmq-server") is None or shutil.which("rabbitmqctl") is None:
        missing("rabbitmq-server is not installed here: cannot boot a node from rabbitmq/")
    with throwaway_node() as node:
        admin_url = f"http://127.0.0.1:{node.management_port}"
        async with httpx.AsyncClient(base_url=admin_url, timeout=30) as http:
            users = await http.get("/api/users", auth=(ADMIN_USER, THROWAWAY_PASSWORDS[ADMIN_USER]))
            env = await http.get(f"http://127.0.0.1:{node.prometheus_port}/metrics")
        assert sorted(u["name"] for u in users.json()) == [ADMIN_USER, SERVICE_USER]
        assert env.status_code == 200
        environment = await asyncio.to_thread(node.environment)
        assert "{consumer_timeout,300000}" in environment
        assert "{max_message_size,131072}" in environment

        amqp_url = (
            f"amqp://{SERVICE_USER}:{THROWAWAY_PASSWORDS[SERVICE_USER]}@127.0.0.1:{node.amqp_port}/"
        )
        on_node = _default_topology(stack).with_settings(amqp_url=(amqp_url,))
        ids = await insert_holds(stack.database_url, 3)
        assert (await produce.scan(on_node.settings)).published == len(ids)
        async with running_consumer(on_node.settings):
            await eventually(lambda: _all_expired(stack, len(ids)))
