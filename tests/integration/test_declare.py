"""``service.declare`` declares the topology; the running processes only check it.

The scan and the consumer declare nothing: a missing exchange or queue stops
them with one line naming it and the declare step; arguments and bindings that
differ (read from the management API) stop them with one line too; and without
that API they warn once and run on the existence check alone.
"""

from __future__ import annotations

import asyncio
import logging

import aio_pika
import pytest

from service import scan
from service.adapters.amqp.declaring import topology_for
from service.core import topology
from service.core.errors import TopologyMismatch
from service.declare import declare
from service.scan import every
from service.settings import Settings
from tests.integration.definitions_support import BrokerAdmin
from tests.support import (
    Stack,
    eventually,
    insert_holds,
    running_consumer,
    statuses,
    wait_for_consumers,
)

pytestmark = pytest.mark.integration

SECRET = "Mg7-never-shown-Kp2"
CLOSED_PORT_URL = "http://127.0.0.1:1"


async def _redeclare(amqp_url: str, queue: str, arguments: dict[str, object]) -> None:
    """Replace ``queue`` with one declared otherwise (as a careless hand would)."""
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        await channel.queue_delete(queue)
        await channel.declare_queue(queue, durable=True, arguments=arguments)  # type: ignore[arg-type]


async def _unbind(amqp_url: str, queue: str, exchange: str, key: str) -> None:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        await (await channel.get_queue(queue)).unbind(exchange, key)


async def _consumer_refuses(settings: Settings, match: str) -> None:
    with pytest.raises(TopologyMismatch, match=match):
        async with running_consumer(settings) as task:
            await task


async def _all_expired(stack: Stack, count: int) -> bool:
    return (await statuses(stack.database_url)).get("expired", 0) == count


async def test_declare_builds_the_whole_topology_in_an_empty_vhost_and_may_run_again(
    bare_stack: Stack,
) -> None:
    """Two runs in an empty vhost: every exchange, queue and binding, as the topology says."""
    admin = BrokerAdmin.like(bare_stack.management)
    await declare(bare_stack.settings)
    await declare(bare_stack.settings)
    expected = topology.definitions(topology_for(bare_stack.settings))
    assert await admin.queue_arguments(bare_stack.vhost) == {
        q["name"]: q["arguments"] for q in expected["queues"]
    }
    assert await admin.exchange_names(bare_stack.vhost) == {
        e["name"] for e in expected["exchanges"]
    }
    assert await admin.bindings(bare_stack.vhost) == {
        (b["source"], b["destination"], b["routing_key"]) for b in expected["bindings"]
    }


async def test_declare_refuses_a_queue_declared_otherwise_with_one_line(stack: Stack) -> None:
    """A work queue re-declared as a classic queue: declare raises TopologyMismatch, one line."""
    await _redeclare(stack.amqp_url, topology.QUEUE, {})
    with pytest.raises(TopologyMismatch, match="queue 'expirations' exists on the broker") as err:
        await declare(stack.settings)
    assert "\n" not in str(err.value)


async def test_scan_and_consumer_declare_nothing_and_name_the_declare_step(
    bare_stack: Stack,
) -> None:
    """In an empty vhost the scan and the consumer stop at the first missing exchange,
    saying to run ``python -m service.declare``, and leave the vhost empty."""
    missing = (
        "exchange 'expirations' does not exist on the broker; "
        "declare the topology first: python -m service.declare"
    )
    with pytest.raises(TopologyMismatch) as err:
        await scan.scan_once(bare_stack.settings)
    assert str(err.value) == missing
    await _consumer_refuses(bare_stack.settings, missing)
    assert await bare_stack.management.queue_names(bare_stack.vhost) == []


async def test_a_missing_queue_is_named(stack: Stack) -> None:
    """A deleted delay queue: the consumer refuses to start, naming it."""
    connection = await aio_pika.connect(stack.amqp_url)
    async with connection:
        await (await connection.channel()).queue_delete(topology.delay_queue(2000))
    await _consumer_refuses(stack.settings, r"queue 'expirations\.retry\.2s' does not exist")


async def test_drift_found_through_the_management_api_stops_scan_and_consumer(
    stack: Stack,
) -> None:
    """A work queue re-declared as a classic queue exists, so only its arguments (read from
    the management API) show the drift: scan and consumer refuse with one line."""
    await _redeclare(stack.amqp_url, topology.QUEUE, {})
    # (RabbitMQ 4 records the classic queue's type among its arguments; 3.10 does not.)
    drifted = (
        "queue 'expirations' exists on the broker with other settings "
        r"\(.*x-delivery-limit missing, expected 10; .*x-queue-type"
    )
    with pytest.raises(TopologyMismatch, match=drifted) as err:
        await scan.scan_once(stack.settings)
    assert "\n" not in str(err.value)
    assert "python -m service.declare" in str(err.value)
    await _consumer_refuses(stack.settings, drifted)


async def test_another_argument_value_is_drift(stack: Stack) -> None:
    """A delay queue with another TTL: the consumer names the queue and the argument."""
    tier = topology_for(stack.settings).queues[1]
    arguments: dict[str, object] = {**tier.arguments, "x-message-ttl": 999}
    await _redeclare(stack.amqp_url, tier.name, arguments)
    await _consumer_refuses(
        stack.settings, r"queue 'expirations\.retry\.1s' .*x-message-ttl=999, expected 1000"
    )


async def test_a_missing_binding_is_drift(stack: Stack) -> None:
    """A delay queue no longer bound to the retry exchange: the consumer refuses to start."""
    await _unbind(stack.amqp_url, topology.delay_queue(1000), topology.RETRY_EXCHANGE, "1s")
    await _consumer_refuses(
        stack.settings,
        r"queue 'expirations\.retry\.1s' .*not bound to exchange 'expirations\.retry' with '1s'",
    )


async def test_scan_on_a_timer_stops_on_drift(stack: Stack) -> None:
    """``produce --every``: a topology that differs ends it at once (not a pass in a loop)."""
    await _redeclare(stack.amqp_url, topology.QUEUE, {})
    async with asyncio.timeout(30):
        with pytest.raises(TopologyMismatch, match="queue 'expirations'"):
            await every.scan_every(stack.settings, 0.2, asyncio.Event())


def _unchecked(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.msg == "topology.arguments_unchecked"]


async def test_without_the_management_api_the_consumer_warns_once_and_runs(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """The management API does not answer: one warning, and the consumer expires holds."""
    caplog.set_level(logging.INFO)
    settings = stack.settings.model_copy(update={"management_url": CLOSED_PORT_URL})
    ids = await insert_holds(stack.database_url, 3)
    await scan.scan_once(settings)
    async with running_consumer(settings) as task:
        await wait_for_consumers(stack.amqp_url, 1, task)
        await eventually(lambda: _all_expired(stack, len(ids)))
    warnings = _unchecked(caplog)
    assert len(warnings) == 2  # the scan's and the consumer's
    assert all(w.levelno == logging.WARNING for w in warnings)
    assert "unreachable" in warnings[0].reason  # type: ignore[attr-defined]


async def test_a_refused_management_login_is_a_warning_that_shows_no_password(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """The management API refuses the login: the scan warns (HTTP 401), runs, and no log
    line holds the password."""
    caplog.set_level(logging.DEBUG)
    base = stack.settings.management_url or ""
    refused = base.replace("://", f"://nobody:{SECRET}@", 1)
    settings = stack.settings.model_copy(update={"management_url": refused})
    await insert_holds(stack.database_url, 2)
    assert (await scan.scan_once(settings)).published == 2
    [warning] = _unchecked(caplog)
    assert "HTTP 401" in warning.reason  # type: ignore[attr-defined]
    assert SECRET not in caplog.text
    assert not [r for r in caplog.records if SECRET in str(r.__dict__)]


async def test_a_checked_topology_gives_no_warning(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    """With the management API answering and the topology as declared: no warning."""
    caplog.set_level(logging.INFO)
    await insert_holds(stack.database_url, 1)
    assert (await scan.scan_once(stack.settings)).published == 1
    assert _unchecked(caplog) == []
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
