"""``rabbitmq/`` against the real broker: the definitions, one user per job, the config.

The shipped definitions are imported into a fresh vhost, and a test user is made
like each shipped one (its tags, its permissions in that vhost, a test
password). Each does its job with only its rights (the deploy declares, the
scan publishes, the consumer consumes, retries, dead-letters, records and
refreshes, the operator replays and gives back, the relay publishes events), and
what it must not do is refused with ACCESS_REFUSED: only the deploy may delete
``expirations.dead``, only the operator (and the deploy) may purge or read it; the
relay may publish to ``expiry.events`` and nothing else. The shipped
``rabbitmq.conf`` and ``enabled_plugins`` boot a node that loads the definitions.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import aio_pika
import aiormq.exceptions
import httpx
import pytest
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from service import deadletters, scan
from service.adapters import amqp
from service.adapters.amqp import returns
from service.adapters.amqp.management import Management, ManagementUnavailable
from service.core import topology
from service.declare import declare
from service.ops import survey
from service.settings import Settings
from tests import support
from tests.events_support import bind_reader_queue, collect_events, running_relay
from tests.integration.definitions_support import (
    ADMIN_USER,
    CONSUMER_USER,
    DEPLOY_USER,
    OPERATOR_USER,
    RELAY_USER,
    SCAN_USER,
    SERVICE_USERS,
    SHA256,
    THROWAWAY_PASSWORDS,
    BrokerAdmin,
    for_vhost_import,
    load_definitions,
    permissions_of,
    permits,
    policy_conflicts,
    rabbit_password_hash,
    salt_of,
    shipped_bindings,
    tags_of,
    throwaway_node,
    users_like_shipped,
    with_credentials,
)
from tests.proxy import tcp_proxy

pytestmark = pytest.mark.integration

# The retry settings of rabbitmq/definitions.json: the defaults (tiers, jitter, slots).
DEFAULT_RETRY: dict[str, Any] = {
    name: Settings.model_fields[name].default
    for name in ("retry_delays", "retry_jitter", "retry_jitter_slots")
}
TOPOLOGY = topology.build_topology(
    DEFAULT_RETRY["retry_delays"],
    jitter=DEFAULT_RETRY["retry_jitter"],
    slots=DEFAULT_RETRY["retry_jitter_slots"],
)
QUEUES = [q.name for q in TOPOLOGY.queues]
EXCHANGES = [e.name for e in TOPOLOGY.exchanges]
RUNNING_USERS = (CONSUMER_USER, SCAN_USER, OPERATOR_USER, RELAY_USER)


@dataclass(frozen=True)
class Shipped:
    """A vhost loaded with the shipped definitions, and a test user like each shipped one."""

    stack: support.Stack
    admin: BrokerAdmin
    urls: dict[str, str]  # shipped user name -> AMQP URL of its test user

    def settings_of(self, user: str, **overrides: Any) -> Settings:
        """The stack's settings, connecting as ``user``'s test user."""
        update = {"amqp_url": (self.urls[user],), **overrides}
        return self.stack.settings.model_copy(update=update)


@pytest.fixture
async def shipped(bare_stack: support.Stack) -> AsyncIterator[Shipped]:
    """The shipped definitions imported into an empty vhost; users made like the shipped."""
    stack = bare_stack.with_settings(**DEFAULT_RETRY)
    admin = BrokerAdmin.like(stack.management)
    await admin.import_definitions(stack.vhost, for_vhost_import(load_definitions()))
    async with users_like_shipped(admin, stack.vhost, stack.amqp_url) as urls:
        yield Shipped(stack, admin, urls)


async def _all_expired(stack: support.Stack, count: int) -> bool:
    return (await support.statuses(stack.database_url)).get("expired", 0) == count


async def _records(stack: support.Stack) -> list[str]:
    async with support.pg_connection(stack.database_url) as conn:
        return [row["message_id"] for row in await conn.fetch("SELECT * FROM dead_letters")]


async def _depth_is(stack: support.Stack, queue: str, depth: int) -> bool:
    return await support.queue_depth(stack.amqp_url, queue) == depth


def _events(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.msg == event]


# -- the definitions themselves ---------------------------------------------------------


def test_no_shipped_policy_disagrees_with_a_queue_argument() -> None:
    """A policy may only repeat what the queues declare (the shipped file has none)."""
    assert policy_conflicts(load_definitions()) == []


def test_shipped_password_hashes_are_of_the_documented_throwaway_passwords() -> None:
    """Each user's hash is RabbitMQ's salted SHA-256 of the password docs/deployment.md names."""
    users = load_definitions()["users"]
    assert sorted(u["name"] for u in users) == sorted([*SERVICE_USERS, ADMIN_USER])
    for user in users:
        assert user["hashing_algorithm"] == SHA256
        password = THROWAWAY_PASSWORDS[user["name"]]
        expected = rabbit_password_hash(password, salt_of(user["password_hash"]))
        assert user["password_hash"] == expected, user["name"]


# What each user's configure, write and read patterns must cover among these names, and
# nothing else: the deploy everything of the service; the rest only what their job needs.
NAMES = [*QUEUES, *EXCHANGES, topology.delay_queue(3_600_000), topology.delay_queue(3_599_999)]
OUTSIDERS = [
    "other",
    "amq.default",
    "amq.direct",
    "expirationsX",
    "x.expirations",
    "expirations.",
    "expiry.eventsX",
    "expiry.events.x",
    "expiryXevents",
]
JOBS: dict[str, dict[str, set[str]]] = {
    DEPLOY_USER: {kind: set(NAMES) for kind in ("configure", "write", "read")},
    CONSUMER_USER: {
        "configure": set(),
        "write": {topology.RETRY_EXCHANGE, topology.DEAD_EXCHANGE},
        "read": {topology.QUEUE, topology.DEAD_LOG_QUEUE},
    },
    SCAN_USER: {"configure": set(), "write": {topology.EXCHANGE}, "read": set()},
    OPERATOR_USER: {
        "configure": set(),
        # amq.default: a replay of events to one queue (python -m service.relay --replay-to)
        "write": {topology.EXCHANGE, topology.DEAD_EXCHANGE, "amq.default"},
        "read": {topology.DEAD_QUEUE},
    },
    RELAY_USER: {"configure": set(), "write": {topology.EVENTS_EXCHANGE}, "read": set()},
}


@pytest.mark.parametrize("user", SERVICE_USERS)
def test_each_users_patterns_cover_exactly_the_names_of_its_job(user: str) -> None:
    """configure, write and read each cover the names the user's job needs, nothing else."""
    patterns = permissions_of(load_definitions(), user)
    for kind, wanted in JOBS[user].items():
        covered = {name for name in NAMES + OUTSIDERS if permits(patterns[kind], name)}
        assert covered == wanted, (user, kind)


def test_only_the_running_processes_may_read_the_management_api() -> None:
    """The consumer, the scan and the relay get ``management`` (the topology check reads
    it); the deploy and the operator no tag; admin is the administrator."""
    shipped = load_definitions()
    tags = {user: tags_of(shipped, user) for user in (*SERVICE_USERS, ADMIN_USER)}
    assert tags == {
        DEPLOY_USER: [],
        CONSUMER_USER: ["management"],
        SCAN_USER: ["management"],
        OPERATOR_USER: [],
        RELAY_USER: ["management"],
        ADMIN_USER: ["administrator"],
    }


@pytest.mark.parametrize("user", SERVICE_USERS)
async def test_broker_accepts_the_shipped_password_hash(stack: support.Stack, user: str) -> None:
    """A user made from the shipped hash logs in with the documented password."""
    admin = BrokerAdmin.like(stack.management)
    [entry] = [u for u in load_definitions()["users"] if u["name"] == user]
    name = f"{user}-hash-{support.RUN_ID}"
    await admin.create_user(name, password_hash=entry["password_hash"], hashing_algorithm=SHA256)
    try:
        await admin.set_permissions(stack.vhost, name, {"configure": "", "write": "", "read": ""})
        connection = await aio_pika.connect(
            with_credentials(stack.amqp_url, name, THROWAWAY_PASSWORDS[user])
        )
        await connection.close()
        with pytest.raises(aio_pika.exceptions.ProbableAuthenticationError):
            await aio_pika.connect(with_credentials(stack.amqp_url, name, "wrong"))
    finally:
        await admin.delete_user(name)


# -- each user does its job with its rights ---------------------------------------------


async def test_the_deploy_step_on_the_imported_definitions_changes_nothing(
    shipped: Shipped,
) -> None:
    """As the deploy user, ``declare`` finds the imported topology as it would declare it."""
    imported = await shipped.admin.queue_arguments(shipped.stack.vhost)
    assert imported == {q["name"]: q["arguments"] for q in load_definitions()["queues"]}
    await declare(shipped.settings_of(DEPLOY_USER))
    vhost = shipped.stack.vhost
    assert await shipped.admin.queue_arguments(vhost) == imported
    assert await shipped.admin.exchange_names(vhost) == set(EXCHANGES)
    assert await shipped.admin.bindings(vhost) == shipped_bindings(load_definitions())


async def test_scan_and_consumer_run_with_only_their_rights(
    shipped: Shipped, caplog: pytest.LogCaptureFixture
) -> None:
    """As their users: the scan publishes, the consumer expires the holds, dead-letters a
    poison body and records it; both checked the topology through the management API."""
    caplog.set_level(logging.INFO)
    stack = shipped.stack
    ids = await support.insert_holds(stack.database_url, 5)
    assert (await scan.scan_once(shipped.settings_of(SCAN_USER))).published == len(ids)
    async with support.attached_consumer(stack, shipped.settings_of(CONSUMER_USER)):
        await support.eventually(lambda: _all_expired(stack, len(ids)))
        await support.publish_raw(
            shipped.urls[SCAN_USER], [b"not a command"], message_ids=["junk-1"]
        )
        await support.eventually(lambda: _depth_is(stack, topology.DEAD_QUEUE, 1))
        await support.eventually(lambda: _has_record(stack, "junk-1"))
    assert _events(caplog, "topology.arguments_unchecked") == []
    assert "ACCESS_REFUSED" not in caplog.text


async def _has_record(stack: support.Stack, message_id: str) -> bool:
    return message_id in await _records(stack)


async def test_the_consumer_retries_through_the_delay_queues_with_its_rights(
    shipped: Shipped, caplog: pytest.LogCaptureFixture
) -> None:
    """As the consumer user, with the database away: copies go to a delay queue and come
    back; once the database is back every hold expires."""
    caplog.set_level(logging.INFO)
    stack = shipped.stack
    ids = await support.insert_holds(stack.database_url, 3)
    async with tcp_proxy(stack.database_url, 5432) as proxy:
        settings = shipped.settings_of(CONSUMER_USER, database_url=proxy.url(stack.database_url))
        async with support.attached_consumer(stack, settings):
            proxy.cut()
            await scan.scan_once(shipped.settings_of(SCAN_USER))
            await support.eventually(lambda: _retried(caplog, len(ids)))
            proxy.restore()
            await support.eventually(lambda: _all_expired(stack, len(ids)), timeout=60)


async def _retried(caplog: pytest.LogCaptureFixture, count: int) -> bool:
    return len(_events(caplog, "expiry.retry")) >= count


async def _dead_letter(url: str, message_id: str) -> None:
    """Publish a dead letter to the dead exchange, as a consumer does (both dead queues)."""
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        exchange = await channel.get_exchange(topology.DEAD_EXCHANGE, ensure=False)
        message = aio_pika.Message(b"{}", message_id=message_id, delivery_mode=2)
        await exchange.publish(message, topology.DEAD_ROUTING_KEY, mandatory=True)


async def test_the_consumer_refreshes_a_dead_letter_log_copy_with_its_rights(
    shipped: Shipped, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """As the consumer user: take a dead letter from ``expirations.dead.log`` and give it
    back as a fresh copy (to that queue alone, by its own name), as the recorder does."""
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(returns, "REFRESH_AT", 0)  # every give-back is a fresh copy
    url, stack = shipped.urls[CONSUMER_USER], shipped.stack
    await _dead_letter(url, "refresh-1")
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        dead_exchange = await channel.get_exchange(topology.DEAD_EXCHANGE, ensure=False)
        log_queue = await channel.get_queue(topology.DEAD_LOG_QUEUE, ensure=False)
        message = await log_queue.get(no_ack=False, timeout=5)
        await returns.give_back(
            message, dead_exchange=dead_exchange, queue=topology.DEAD_LOG_QUEUE, timeout=5
        )
    [refreshed] = _events(caplog, "deadletter.refreshed")
    assert refreshed.queue == topology.DEAD_LOG_QUEUE  # type: ignore[attr-defined]
    assert await support.queue_depth(stack.amqp_url, topology.DEAD_LOG_QUEUE) == 1
    assert await support.queue_depth(stack.amqp_url, topology.DEAD_QUEUE) == 1


async def test_the_operator_replays_and_gives_back_with_its_rights(
    shipped: Shipped, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """As the operator user: ``status`` reads every queue, a replay takes the dead letters,
    republishes one and gives the other back as a fresh copy."""
    caplog.set_level(logging.INFO)
    stack = shipped.stack
    async with support.attached_consumer(stack, shipped.settings_of(CONSUMER_USER)):
        await support.publish_raw(
            stack.amqp_url, [b"junk", b"junk"], message_ids=["junk-1", "junk-2"]
        )
        await support.eventually(lambda: _record_count_is(stack, 2))
    operator = shipped.settings_of(OPERATOR_USER, replay_operators=("alice",))
    async with amqp.connected(operator, name="test-status") as connection:
        queues = await survey.read_queues(connection, operator)
    assert [(q.name, q.ready) for q in queues if q.name == topology.DEAD_QUEUE] == [
        (topology.DEAD_QUEUE, 2)
    ]
    assert all(q.ready is not None for q in queues)
    monkeypatch.setattr(returns, "REFRESH_AT", 0)
    args = deadletters.build_parser().parse_args(["replay", "junk-1", "--operator", "alice"])
    assert await deadletters.replay_command(operator, args) == 0
    assert await support.queue_depth(stack.amqp_url, topology.QUEUE) == 1  # junk-1, replayed
    assert await support.queue_depth(stack.amqp_url, topology.DEAD_QUEUE) == 1  # junk-2, given back
    [refreshed] = _events(caplog, "deadletter.refreshed")
    assert refreshed.queue == topology.DEAD_QUEUE  # type: ignore[attr-defined]


async def test_the_relay_publishes_events_with_only_its_rights(
    shipped: Shipped, caplog: pytest.LogCaptureFixture
) -> None:
    """As the relay user: it checks the events exchange through the management API and
    publishes the events of expired holds to a reader's queue; it may publish nothing to
    the commands' exchange, nor read a queue."""
    caplog.set_level(logging.INFO)
    stack = shipped.stack
    queue = await bind_reader_queue(stack.amqp_url)
    ids = await support.insert_holds(stack.database_url, 5)
    assert (await scan.scan_once(shipped.settings_of(SCAN_USER))).published == len(ids)
    async with support.attached_consumer(stack, shipped.settings_of(CONSUMER_USER)):
        await support.eventually(lambda: _all_expired(stack, len(ids)))
    relay = shipped.settings_of(RELAY_USER, relay_poll_seconds=0.2)
    async with running_relay(relay):
        received = await collect_events(stack.amqp_url, queue, len(ids))
    assert len({e.message_id for e in received}) == len(ids)
    assert _events(caplog, "topology.arguments_unchecked") == []
    assert "ACCESS_REFUSED" not in caplog.text
    url = shipped.urls[RELAY_USER]
    assert await _outcome(url, _publish_to(topology.EXCHANGE)) == "refused"
    assert await _outcome(url, _publish_to(topology.DEAD_EXCHANGE)) == "refused"
    assert await _outcome(url, _get_from(queue)) == "refused"


def _publish_to(exchange: str) -> Operation:
    async def publish(channel: AbstractChannel) -> object:
        target = await channel.get_exchange(exchange, ensure=False)
        return await target.publish(aio_pika.Message(b"{}"), "x", timeout=5)

    return publish


def _get_from(queue: str) -> Operation:
    async def get(channel: AbstractChannel) -> object:
        return await (await channel.get_queue(queue, ensure=False)).get(fail=False, timeout=5)

    return get


async def _record_count_is(stack: support.Stack, count: int) -> bool:
    return len(await _records(stack)) == count


async def test_the_consumer_gets_its_consumers_back_after_a_reconnect_without_declaring(
    shipped: Shipped,
) -> None:
    """Its connection closed by the broker, the consumer (which may not configure) takes
    the work queue and the dead-letter log again with passive declares, and goes on."""
    stack = shipped.stack
    async with support.attached_consumer(stack, shipped.settings_of(CONSUMER_USER)) as consumer:
        assert await support.consumer_count(stack.amqp_url, topology.DEAD_LOG_QUEUE) == 1
        await support.eventually(lambda: _closed(stack), timeout=30)  # once the API lists it
        await support.eventually(lambda: _consumers_back(stack), timeout=60)
        ids = await support.insert_holds(stack.database_url, 3)
        await scan.scan_once(shipped.settings_of(SCAN_USER))
        await support.eventually(lambda: _all_expired(stack, len(ids)))
        assert not consumer.done()


async def _closed(stack: support.Stack) -> bool:
    return await stack.management.close_connections(stack.vhost) >= 1


async def _consumers_back(stack: support.Stack) -> bool:
    counts = [
        await support.consumer_count(stack.amqp_url, q)
        for q in (topology.QUEUE, topology.DEAD_LOG_QUEUE)
    ]
    return counts == [1, 1]


# -- what each user must not do ---------------------------------------------------------

Operation = Callable[[AbstractChannel], Awaitable[object]]


async def _outcome(url: str, operation: Operation) -> str:
    """``ok``, or ``refused`` when the broker answers ACCESS_REFUSED."""
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        await operation(channel)
    except aiormq.exceptions.ChannelAccessRefused:
        return "refused"
    finally:
        await connection.close()
    return "ok"


def _declare_queue(spec: topology.QueueSpec) -> Operation:
    return lambda ch: ch.declare_queue(spec.name, durable=True, arguments=dict(spec.arguments))


def _declare_exchange(name: str) -> Operation:
    return lambda ch: ch.declare_exchange(name, aio_pika.ExchangeType.DIRECT, durable=True)


def _delete_queue(name: str) -> Operation:
    return lambda ch: ch.queue_delete(name)


async def _purge_dead(channel: AbstractChannel) -> object:
    return await (await channel.get_queue(topology.DEAD_QUEUE, ensure=False)).purge()


async def _get_dead(channel: AbstractChannel) -> object:
    queue = await channel.get_queue(topology.DEAD_QUEUE, ensure=False)
    message = await queue.get(no_ack=False, fail=False, timeout=5)
    if message is not None:
        await message.reject(requeue=True)
    return message


async def _consume_dead(channel: AbstractChannel) -> object:
    queue = await channel.get_queue(topology.DEAD_QUEUE, ensure=False)
    return await queue.cancel(await queue.consume(_give_back))


async def _give_back(message: AbstractIncomingMessage) -> None:
    await message.reject(requeue=True)


def _configuring() -> dict[str, Operation]:
    """Every declaration and deletion of the service's queues and exchanges."""
    operations = {f"declare queue {q.name}": _declare_queue(q) for q in TOPOLOGY.queues}
    operations |= {f"declare exchange {name}": _declare_exchange(name) for name in EXCHANGES}
    operations |= {f"delete queue {name}": _delete_queue(name) for name in QUEUES}
    operations[f"delete exchange {topology.DEAD_EXCHANGE}"] = lambda ch: ch.exchange_delete(
        topology.DEAD_EXCHANGE
    )
    return operations


READING_THE_DEAD: dict[str, Operation] = {
    "purge expirations.dead": _purge_dead,
    "get from expirations.dead": _get_dead,
    "consume expirations.dead": _consume_dead,
}


async def test_no_running_user_may_declare_or_delete_anything(shipped: Shipped) -> None:
    """Consumer, scan and operator: every declaration and deletion is ACCESS_REFUSED."""
    outcomes = {
        (user, what): await _outcome(shipped.urls[user], operation)
        for user in RUNNING_USERS
        for what, operation in _configuring().items()
    }
    assert {outcome for outcome in outcomes.values()} == {"refused"}, outcomes
    assert sorted(await shipped.stack.management.queue_names(shipped.stack.vhost)) == sorted(QUEUES)


async def test_neither_consumer_nor_scan_may_read_or_purge_the_dead_letters(
    shipped: Shipped,
) -> None:
    """Consumer, scan and relay: purge, get and consume of ``expirations.dead`` are
    ACCESS_REFUSED, over AMQP and through the management API (where their tag lets them
    read the topology)."""
    await _dead_letter(shipped.urls[CONSUMER_USER], "kept-1")
    for user in (CONSUMER_USER, SCAN_USER, RELAY_USER):
        for what, operation in READING_THE_DEAD.items():
            assert await _outcome(shipped.urls[user], operation) == "refused", (user, what)
        assert await _through_the_api(shipped, user) == [401, 401, 401]
    assert await support.queue_depth(shipped.stack.amqp_url, topology.DEAD_QUEUE) == 1


async def _through_the_api(shipped: Shipped, user: str) -> list[int | None]:
    """Status codes of delete, purge and get of ``expirations.dead`` through the API (None:
    done)."""
    base = shipped.stack.settings.management_url
    url = urlsplit(shipped.urls[user])
    user_name, password = unquote(url.username or ""), unquote(url.password or "")
    client = Management(base or "", user=user_name, password=password)
    queue = f"/queues/{quote(shipped.stack.vhost, safe='')}/{topology.DEAD_QUEUE}"
    get = {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}
    calls = (
        ("DELETE", queue, None),
        ("DELETE", f"{queue}/contents", None),
        ("POST", f"{queue}/get", get),
    )
    codes: list[int | None] = []
    for method, path, body in calls:
        try:
            await client.request(method, path, body)
        except ManagementUnavailable as exc:
            codes.append(exc.status)
        else:
            codes.append(None)
    return codes


async def test_the_deploy_user_may_not_step_outside_the_service_names(shipped: Shipped) -> None:
    """The deploy user declares only ``expirations`` names and ``expiry.events``: anything
    else is ACCESS_REFUSED."""
    url = shipped.urls[DEPLOY_USER]
    for name in ("not-expirations", "expirationsX", "x.expirations", "expiry.eventsX"):
        queue = topology.QueueSpec(name, topology.EXCHANGE, "x")
        assert await _outcome(url, _declare_queue(queue)) == "refused", name
        assert await _outcome(url, _declare_exchange(name)) == "refused", name


async def test_only_the_operator_purges_and_only_the_deploy_deletes_the_dead_letters(
    shipped: Shipped,
) -> None:
    """The operator may read and purge ``expirations.dead`` but not delete it; the deploy
    user may delete it."""
    operator, deploy = shipped.urls[OPERATOR_USER], shipped.urls[DEPLOY_USER]
    await _dead_letter(shipped.urls[CONSUMER_USER], "purged-1")
    assert await _outcome(operator, _get_dead) == "ok"
    assert await _outcome(operator, _purge_dead) == "ok"
    assert await support.queue_depth(shipped.stack.amqp_url, topology.DEAD_QUEUE) == 0
    assert await _outcome(operator, _delete_queue(topology.DEAD_QUEUE)) == "refused"
    assert await _outcome(deploy, _delete_queue(topology.DEAD_QUEUE)) == "ok"
    names = await shipped.stack.management.queue_names(shipped.stack.vhost)
    assert topology.DEAD_QUEUE not in names


# -- the shipped files boot a node ------------------------------------------------------


@pytest.mark.private_broker
async def test_shipped_config_boots_a_node_that_loads_the_definitions(
    stack: support.Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """rabbitmq.conf + enabled_plugins + definitions.json, unchanged, boot a node: the
    definitions are loaded (no guest), the limits are set, the plugins answer; with the
    shipped users and passwords the deploy declares, the scan, a consumer and the relay run
    and check the topology through the management API."""
    if shutil.which("rabbitmq-server") is None or shutil.which("rabbitmqctl") is None:
        support.missing("rabbitmq-server is not installed here: cannot boot a node from rabbitmq/")
    caplog.set_level(logging.INFO)
    with throwaway_node() as node:
        admin_url = f"http://127.0.0.1:{node.management_port}"
        admin = Management(admin_url, user=ADMIN_USER, password=THROWAWAY_PASSWORDS[ADMIN_USER])
        users = await admin.request("GET", "/users")
        async with httpx.AsyncClient(timeout=30) as http:
            metrics = await http.get(f"http://127.0.0.1:{node.prometheus_port}/metrics")
        assert sorted(u["name"] for u in users) == sorted([ADMIN_USER, *SERVICE_USERS])
        assert metrics.status_code == 200
        environment = await asyncio.to_thread(node.environment)
        assert "{consumer_timeout,300000}" in environment
        assert "{max_message_size,131072}" in environment

        def on_node(user: str) -> Settings:
            amqp_url = f"amqp://{user}:{THROWAWAY_PASSWORDS[user]}@127.0.0.1:{node.amqp_port}/"
            update = {"amqp_url": (amqp_url,), **DEFAULT_RETRY}
            return stack.settings.model_copy(update=update | {"management_url": admin_url})

        await declare(on_node(DEPLOY_USER))
        admin_amqp = (
            f"amqp://{ADMIN_USER}:{THROWAWAY_PASSWORDS[ADMIN_USER]}@127.0.0.1:{node.amqp_port}/"
        )
        queue = await bind_reader_queue(admin_amqp)
        ids = await support.insert_holds(stack.database_url, 3)
        assert (await scan.scan_once(on_node(SCAN_USER))).published == len(ids)
        async with support.running_consumer(on_node(CONSUMER_USER)):
            await support.eventually(lambda: _all_expired(stack, len(ids)))
        async with running_relay(
            on_node(RELAY_USER).model_copy(update={"relay_poll_seconds": 0.2})
        ):
            assert len(await collect_events(admin_amqp, queue, len(ids))) == len(ids)
    assert _events(caplog, "topology.arguments_unchecked") == []
