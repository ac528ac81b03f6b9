"""The built image runs the service as a deployment runs it: each command in a container
of its own, as the image's non-root user on a read-only root filesystem, against the
test run's PostgreSQL and RabbitMQ; stopped by ``docker stop`` and killed by
``docker kill``, with every hold expired exactly once."""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import pytest

from service.console.auth import hash_password
from tests.image.containers import Containers, docker_ok
from tests.image.world import CONSUMER_ROLE, FIGURES, OPERATOR_ROLE, SCAN_ROLE, World
from tests.support import eventually, free_port, insert_holds, pg_connection

pytestmark = pytest.mark.image

# compose.yaml's stop_grace_period for a consumer: EXPIRY_SHUTDOWN_TIMEOUT_SECONDS (30) + 10.
CONSUMER_GRACE = 40
SCANNER_GRACE = 20
# How often the image's HEALTHCHECK runs here (its own interval, 30 s, is for production).
HEALTH_INTERVAL = "1s"

HOLDS_AT_ONCE = 3000  # due already: one `produce --scan` publishes them all
HOLDS_STREAMED = 6000  # due over STREAM_SECONDS: the scanner publishes them as they fall due
STREAM_SECONDS = 8


def python_m(module: str, *args: str) -> list[str]:
    """The container command ``python -m service.<module> args``."""
    return ["python", "-m", f"service.{module}", *args]


async def insert_holds_due_over(url: str, count: int, seconds: float) -> list[uuid.UUID]:
    """``count`` holds whose deadlines fall evenly over the next ``seconds``."""
    async with pg_connection(url) as conn:
        rows = await conn.fetch(
            """
            INSERT INTO reservations (id, hold_until)
            SELECT gen_random_uuid(), now() + make_interval(secs => n * $2::float8 / $1)
              FROM generate_series(1, $1) AS n
            RETURNING id
            """,
            count,
            seconds,
        )
    return [row["id"] for row in rows]


async def start_serving(world: World, role: str, command: list[str], db_role: str) -> str:
    """A long-running command with its HTTP endpoint (so the health check asks /readyz)."""
    env = world.env(db_role, EXPIRY_HTTP_HOST="127.0.0.1", EXPIRY_HTTP_PORT=str(free_port()))
    return await world.containers.start(role, command, env, "--health-interval", HEALTH_INTERVAL)


async def run_step(world: World, module: str, *args: str, role: str | None = None) -> float:
    """Run a one-off command in a container; it must exit 0. Its seconds."""
    done = await world.containers.run(module, python_m(module, *args), world.env(role))
    assert done.exit_code == 0, f"{module} exited {done.exit_code}: {done.output[-3000:]}"
    FIGURES.append(f"{' '.join([module, *args])}: exit 0 in {done.seconds:.1f} s")
    return done.seconds


async def wait_expired(world: World, count: int, timeout: float = 120) -> None:
    """Wait until ``count`` holds in all are expired."""

    async def reached() -> bool:
        return await world.expired() >= count

    await eventually(reached, timeout=timeout, every=0.05)


async def stop_ok(containers: Containers, name: str, grace: float) -> float:
    """``docker stop``: the process must exit 0 within ``grace``; the seconds it took."""
    finished = await containers.stop(name, grace)
    assert finished.exit_code == 0, f"{name} exited {finished.exit_code}: {finished.output}"
    assert finished.seconds < grace, f"{name} took {finished.seconds:.1f} s of {grace} s"
    return finished.seconds


async def test_the_image_deploys_expires_and_stops_cleanly_under_kill_and_stop(
    world: World,
) -> None:
    """migrate, declare, a scan, three consumers and the scanner, each a container of the
    image: a consumer frozen holding deliveries and then killed, another stopped
    mid-stream, and every hold still expires exactly once; each ``docker stop`` ends
    its process with exit 0 within its grace; retention and verify succeed."""
    containers = world.containers
    await run_step(world, "migrate")
    await run_step(world, "declare")

    started = time.monotonic()
    consumers = [
        await start_serving(world, "consumer", python_m("consume"), CONSUMER_ROLE) for _ in range(3)
    ]
    healthy = max([await containers.wait_healthy(name) for name in consumers])
    FIGURES.append(
        f"3 consumers healthy (the image's HEALTHCHECK: /readyz and both servers) "
        f"within {time.monotonic() - started:.1f} s (the last {healthy:.1f} s after its turn)"
    )

    # All at once: one scan publishes them.
    at_once = await insert_holds(world.database_url, HOLDS_AT_ONCE)
    started = time.monotonic()
    await run_step(world, "produce", "--scan", role=SCAN_ROLE)
    await wait_expired(world, HOLDS_AT_ONCE)
    FIGURES.append(
        f"{HOLDS_AT_ONCE} holds due at once expired by 3 consumer containers "
        f"{time.monotonic() - started:.1f} s after the scan's container started"
    )
    await world.assert_each_expired_once(at_once)

    # A stream: the scanner publishes holds as they fall due.
    scanner = await start_serving(world, "scanner", python_m("produce", "--every", "1"), SCAN_ROLE)
    await containers.wait_healthy(scanner)
    streamed = await insert_holds_due_over(world.database_url, HOLDS_STREAMED, STREAM_SECONDS)
    total = HOLDS_AT_ONCE + HOLDS_STREAMED
    started = time.monotonic()

    # Frozen while the broker fills its prefetch with deliveries, then SIGKILLed.
    await wait_expired(world, HOLDS_AT_ONCE + HOLDS_STREAMED // 4)
    await docker_ok("pause", consumers[0])
    await asyncio.sleep(1)
    at_kill = await world.expired() - HOLDS_AT_ONCE
    await docker_ok("kill", consumers[0])
    killed = (await containers.inspect(consumers[0]))["State"]["ExitCode"]
    assert killed == 137, f"the killed consumer exited {killed}"
    assert at_kill < HOLDS_STREAMED, "the stream ended before the kill"

    # Stopped mid-stream: it finishes what it holds and exits 0.
    await wait_expired(world, HOLDS_AT_ONCE + (HOLDS_STREAMED * 3) // 5)
    at_stop = await world.expired() - HOLDS_AT_ONCE
    stopped = await stop_ok(containers, consumers[1], CONSUMER_GRACE)
    assert at_stop < HOLDS_STREAMED, "the stream ended before the stop"

    await wait_expired(world, total)
    FIGURES.append(
        f"{HOLDS_STREAMED} holds due over {STREAM_SECONDS} s, published by the scanner "
        f"container: consumer 1 frozen then killed (exit 137) at {at_kill} expired, "
        f"consumer 2 stopped at {at_stop} (exit 0 in {stopped:.1f} s, grace {CONSUMER_GRACE} s); "
        f"all expired in {time.monotonic() - started:.1f} s, each once"
    )
    await world.assert_each_expired_once(at_once + streamed)

    last = await stop_ok(containers, consumers[2], CONSUMER_GRACE)
    scan_stop = await stop_ok(containers, scanner, SCANNER_GRACE)
    FIGURES.append(
        f"docker stop: the last consumer exit 0 in {last:.1f} s, "
        f"the scanner exit 0 in {scan_stop:.1f} s (grace {SCANNER_GRACE} s)"
    )

    await run_step(world, "retention")
    await run_step(world, "verify", role=OPERATOR_ROLE)


async def test_the_console_answers_in_its_container(world: World) -> None:
    """The console's container serves the login page, lets an operator in, shows the dead
    letters, and stops with exit 0 on ``docker stop``."""
    await run_step(world, "migrate")
    await run_step(world, "declare")
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
