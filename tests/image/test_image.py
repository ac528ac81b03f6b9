"""The built image runs the service as a deployment runs it: each command in a container
of its own, as the image's non-root user on a read-only root filesystem, against the
test run's PostgreSQL and RabbitMQ; stopped by ``docker stop`` and killed by
``docker kill``, with every hold expired exactly once and its event published to a
reader's queue."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import httpx
import pytest

from service.console.auth import hash_password
from tests.events_support import bind_reader_queue, collect_events
from tests.image.containers import docker_ok, docker_pause
from tests.image.world import (
    CONSUMER_GRACE,
    CONSUMER_ROLE,
    DELIVER_GRACE,
    DELIVER_ROLE,
    FIGURES,
    OPERATOR_ROLE,
    RELAY_GRACE,
    RELAY_ROLE,
    SCAN_ROLE,
    SCANNER_GRACE,
    World,
    insert_holds_due_over,
    python_m,
    stop_ok,
)
from tests.support import eventually, free_port, insert_holds
from tests.webhook_support import LOOPBACK, Receiver, receiving

pytestmark = pytest.mark.image

HOLDS_AT_ONCE = 3000  # due already: one `produce --scan` publishes them all
HOLDS_STREAMED = 6000  # due over STREAM_SECONDS: the scanner publishes them as they fall due
STREAM_SECONDS = 8


async def step(world: World, module: str, *args: str, role: str | None = None) -> None:
    """A one-off command in a container, which must exit 0; its time is a figure."""
    seconds = await world.run_step(module, *args, role=role)
    FIGURES.append(f"{' '.join([module, *args])}: exit 0 in {seconds:.1f} s")


async def test_the_image_deploys_expires_and_stops_cleanly_under_kill_and_stop(
    world: World,
) -> None:
    """migrate, declare, a scan, three consumers, the scanner, the relay and a deliverer,
    each a container of the image: a consumer frozen holding deliveries and then killed,
    another stopped mid-stream, and every hold still expires exactly once, its event on a
    reader's queue once with its message id and POSTed, signed, to a receiver on the
    loopback; each ``docker stop`` ends its process with exit 0 within its grace;
    retention and verify succeed."""
    async with receiving() as receiver:
        await _deploy_expire_and_stop(world, receiver)


async def _deploy_expire_and_stop(world: World, receiver: Receiver) -> None:
    containers = world.containers
    await step(world, "migrate")
    await step(world, "declare")
    reader = await bind_reader_queue(world.amqp_url)
    relay = await world.start_serving("relay", python_m("relay"), RELAY_ROLE)
    endpoint = {
        "name": "orders",
        "url": receiver.url(),
        "secret": receiver.secret,
        "allow_networks": LOOPBACK,
        "rate_per_second": 10_000,  # 20 a second by default: 9,000 events would take minutes
    }
    deliverer = await world.start_serving(
        "deliver", python_m("deliver"), DELIVER_ROLE, EXPIRY_WEBHOOKS=json.dumps([endpoint])
    )

    started = time.monotonic()
    consumers = [
        await world.start_serving("consumer", python_m("consume"), CONSUMER_ROLE) for _ in range(3)
    ]
    FIGURES.append(
        f"3 consumers started one after the other, each healthy (the image's HEALTHCHECK: "
        f"/readyz and both servers) before the next: {time.monotonic() - started:.1f} s"
    )

    # All at once: one scan publishes them.
    at_once = await insert_holds(world.database_url, HOLDS_AT_ONCE)
    started = time.monotonic()
    await step(world, "produce", "--scan", role=SCAN_ROLE)
    await world.wait_expired(HOLDS_AT_ONCE)
    FIGURES.append(
        f"{HOLDS_AT_ONCE} holds due at once expired by 3 consumer containers "
        f"{time.monotonic() - started:.1f} s after the scan's container started"
    )
    await world.assert_each_expired_once(at_once)

    # A stream: the scanner publishes holds as they fall due.
    scanner = await world.start_serving("scanner", python_m("produce", "--every", "1"), SCAN_ROLE)
    streamed = await insert_holds_due_over(world.database_url, HOLDS_STREAMED, STREAM_SECONDS)
    total = HOLDS_AT_ONCE + HOLDS_STREAMED
    started = time.monotonic()

    # Frozen while the broker fills its prefetch with deliveries, then SIGKILLed.
    await world.wait_expired(HOLDS_AT_ONCE + HOLDS_STREAMED // 4)
    await docker_pause(consumers[0])
    await asyncio.sleep(1)
    at_kill = await world.expired() - HOLDS_AT_ONCE
    await docker_ok("kill", consumers[0])
    killed = (await containers.inspect(consumers[0]))["State"]["ExitCode"]
    assert killed == 137, f"the killed consumer exited {killed}"
    assert at_kill < HOLDS_STREAMED, "the stream ended before the kill"

    # Stopped mid-stream: it finishes what it holds and exits 0.
    await world.wait_expired(HOLDS_AT_ONCE + (HOLDS_STREAMED * 3) // 5)
    at_stop = await world.expired() - HOLDS_AT_ONCE
    stopped = await stop_ok(containers, consumers[1], CONSUMER_GRACE)
    assert at_stop < HOLDS_STREAMED, "the stream ended before the stop"

    await world.wait_expired(total)
    FIGURES.append(
        f"{HOLDS_STREAMED} holds due over {STREAM_SECONDS} s, published by the scanner "
        f"container: consumer 1 frozen then killed (exit 137) at {at_kill} expired, "
        f"consumer 2 stopped at {at_stop} (exit 0 in {stopped:.1f} s, grace {CONSUMER_GRACE} s); "
        f"all expired in {time.monotonic() - started:.1f} s, each once"
    )
    await world.assert_each_expired_once(at_once + streamed)

    started = time.monotonic()
    events = await collect_events(world.amqp_url, reader, total, timeout=120)
    assert Counter(e.message_id for e in events) == Counter(
        await world.event_ids(at_once + streamed)
    )
    FIGURES.append(
        f"the relay container (as {RELAY_ROLE}): {len(events)} events on the reader's queue, "
        f"one per expiry with its message id ({time.monotonic() - started:.1f} s after the "
        "last expiry)"
    )

    expected = sorted(await world.event_ids(at_once + streamed))

    async def all_posted() -> bool:
        return sorted(set(receiver.ids())) == expected

    await eventually(all_posted, timeout=120, every=0.5)
    assert all(request.verified for request in receiver.received)
    FIGURES.append(
        f"the deliverer container (as {DELIVER_ROLE}): {len(expected)} events POSTed to a "
        f"receiver on the loopback, each signed and verified ({len(receiver.received)} "
        f"requests; {time.monotonic() - started:.1f} s after the last expiry)"
    )

    last = await stop_ok(containers, consumers[2], CONSUMER_GRACE)
    scan_stop = await stop_ok(containers, scanner, SCANNER_GRACE)
    relay_stop = await stop_ok(containers, relay, RELAY_GRACE)
    deliver_stop = await stop_ok(containers, deliverer, DELIVER_GRACE)
    FIGURES.append(
        f"docker stop: the last consumer exit 0 in {last:.1f} s, "
        f"the scanner exit 0 in {scan_stop:.1f} s (grace {SCANNER_GRACE} s), "
        f"the relay exit 0 in {relay_stop:.1f} s (grace {RELAY_GRACE} s), "
        f"the deliverer exit 0 in {deliver_stop:.1f} s (grace {DELIVER_GRACE} s)"
    )

    await step(world, "retention")
    retention = await containers.start(
        "retention", python_m("retention", "--every", "3600"), world.env()
    )
    await containers.wait_for_output(retention, "retention done")
    retention_stop = await stop_ok(containers, retention, SCANNER_GRACE)
    FIGURES.append(
        f"retention --every 3600: a run done, docker stop: exit 0 in {retention_stop:.1f} s"
    )
    await step(world, "verify", role=OPERATOR_ROLE)


async def test_the_console_answers_in_its_container(world: World) -> None:
    """The console's container serves the login page, lets an operator in, shows the dead
    letters, and stops with exit 0 on ``docker stop``."""
    await step(world, "migrate")
    await step(world, "declare")
    port = free_port()
    password = "an-operator-password-0123"
    env = world.env(
        OPERATOR_ROLE,
        EXPIRY_CONSOLE_PORT=str(port),
        EXPIRY_CONSOLE_USERS=f"alice:{hash_password(password)}",
        EXPIRY_CONSOLE_SECRET="a-console-secret-for-the-image-test-0123456789",
        EXPIRY_REPLAY_OPERATORS="alice",
    )
    name = await world.containers.start("console", python_m("console"), env)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:

        async def answers() -> bool:
            try:
                return (await client.get("/login")).status_code == 200
            except httpx.TransportError:
                return False

        await eventually(answers, timeout=60, every=0.3)
        page = await client.get("/login")
        token = page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        login = await client.post(
            "/login", data={"csrf": token, "name": "alice", "password": password}
        )
        assert login.status_code == 303, login.text
        overview = await client.get("/")
        assert overview.status_code == 200
    seconds = await stop_ok(world.containers, name, 10)
    FIGURES.append(f"console: /login 200, signed in, / 200; docker stop: exit 0 in {seconds:.1f} s")


async def test_a_container_stopped_as_it_starts_exits_0_at_once(world: World) -> None:
    """``docker stop`` in a consumer's, a scanner's and a relay's first moments (the
    process is the container's PID 1 and catches SIGTERM, but does not listen for it yet)
    ends each with exit 0 in seconds, not with SIGKILL at the end of its grace.

    The stop waits until the process catches SIGTERM (its ``SigCgt`` in /proc): before,
    while Python itself starts, the kernel drops a SIGTERM to PID 1 that nothing catches,
    which no code of the service can change (docs/deployment.md, "The image": ``--init``)."""
    await world.run_step("migrate")
    await world.run_step("declare")
    figures = []
    for name, command, role, grace in (
        ("consumer", python_m("consume"), CONSUMER_ROLE, CONSUMER_GRACE),
        ("scanner", python_m("produce", "--every", "1"), SCAN_ROLE, SCANNER_GRACE),
        ("relay", python_m("relay"), RELAY_ROLE, RELAY_GRACE),
    ):
        started = await world.containers.start(name, command, world.env(role))
        await world.containers.wait_catching_sigterm(started)
        seconds = await stop_ok(world.containers, started, grace)
        assert seconds < 10, f"the {name} took {seconds:.1f} s to stop"
        figures.append(f"{name} exit 0 in {seconds:.1f} s")
    FIGURES.append("docker stop right after docker run: " + ", ".join(figures))
