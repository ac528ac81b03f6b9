"""The rollout of issue 44 (its "What it must show"): the previous release's deliverers
beside the new schema lose nothing.

The deliverer of the commit before issue 44's first (``ae8379a^``: before migrations
0016 to 0018), from a tree and a venv of its own (``tests/rollout_support.py``), runs as
``python -m service.deliver`` against a database migrated to the current head, beside a
current deliverer, both as the role expiry_deliver, both serving one endpoint (the same
name and secret; each its own path on the loopback receiver, which tells whose each
request was). Expiries are made while both run; every event's webhook reaches the
receiver with its webhook-id and a signature the endpoint's secret verifies, none is
dead, both stop on SIGTERM with 0, and nothing is left in webhook_deliveries.

The old deliverer records no attempt (webhook_attempts is 0017's): the current one's
2xx attempts are exactly the events it delivered, the old one's have none. (So verify's
check event-without-its-webhook counts each event an old deliverer delivered more than a
minute after migration 0017, to an endpoint registered a minute before the event, as a
lost webhook while the two releases run side by side.)

After a pause (the second case: 503 for 3 s) the old deliverer may take the probe and
never send it: its courier reads the probe's window as a pause (the bug ae8379a fixed),
so the endpoint sends nothing until that window (the lease, ``LEASE_SECONDS`` here, 60 s
by default) lapses and a current deliverer claims the next probe first. Nothing is lost
(the deliveries wait, neither dead nor older than their budget): the test prints how
long the endpoint stayed silent after the outage.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from service.adapters import postgres
from tests import support
from tests.rollout_support import OldRelease, Running, build_old_release, clean_env, start
from tests.webhook_support import (
    LOOPBACK,
    Receiver,
    Reply,
    dead_letters,
    deliveries,
    receiving,
)

# one_broker: HTTP and PostgreSQL only. slow: about 22 s, and the old release's venv comes
# from uv's cache or the package registry: a rollout's proof for CI (leg 1), not for the
# fast suite's loop.
pytestmark = [pytest.mark.integration, pytest.mark.one_broker, pytest.mark.slow]

BEFORE_ISSUE_44 = "ae8379a^"
EVENTS = 300
BATCH = 25  # expiries a transaction
DELIVER = "service.deliver"
LEASE_SECONDS = 8


@pytest.fixture(scope="module")
def old_release(tmp_path_factory: pytest.TempPathFactory) -> OldRelease:
    """The previous release's tree and venv, made once for the module."""
    try:
        release = build_old_release(BEFORE_ISSUE_44, tmp_path_factory.mktemp("rollout"))
    except RuntimeError as exc:
        support.missing(f"the release before issue 44 could not be set up: {exc}")
    loaded = release.check()
    assert loaded == release.root / "service" / "__init__.py", loaded
    print(f"\n{BEFORE_ISSUE_44}: tree and venv made in {release.built_in:.1f} s; {loaded}")
    return release


def _env(stack: support.Stack, receiver: Receiver, which: str, port: int) -> dict[str, str]:
    """A deliverer's environment: the one endpoint (``/which`` on the receiver), quick
    polls, retries and pauses, as expiry_deliver; only settings the old release knows."""
    endpoint = {
        "name": "orders",
        "url": receiver.url(f"/{which}"),
        "secret": receiver.secret,
        "allow_networks": LOOPBACK,
        "timeout_seconds": 2,
        "rate_per_second": 100,
    }
    return clean_env(
        stack.env(
            DATABASE_URL=support.as_role(stack.database_url, "expiry_deliver"),
            EXPIRY_WEBHOOKS=json.dumps([endpoint]),
            EXPIRY_WEBHOOK_POLL_SECONDS="0.1",
            # Also the probe's window after a pause (both releases): see the module docstring.
            EXPIRY_WEBHOOK_LEASE_SECONDS=str(LEASE_SECONDS),
            EXPIRY_WEBHOOK_BACKOFF_SECONDS="0.2",
            EXPIRY_WEBHOOK_BACKOFF_CAP_SECONDS="1",
            EXPIRY_WEBHOOK_PAUSE_SECONDS="0.5",
            EXPIRY_WEBHOOK_PAUSE_CAP_SECONDS="1",
            EXPIRY_WORKER_ID=f"{which}-deliverer",
            EXPIRY_HTTP_PORT=str(port),
        )
    )


async def _expire(stack: support.Stack, count: int) -> None:
    """``count`` holds made and expired, ``BATCH`` a transaction, as the consumer does."""
    ids = await support.insert_holds(stack.database_url, count)
    async with support.pg_connection(stack.database_url) as conn:
        for at in range(0, count, BATCH):
            chunk = ids[at : at + BATCH]
            names = [f"expire-{rid}" for rid in chunk]
            await postgres.expire_batch(conn, chunk, names, [1] * len(chunk), worker="rollout")
            await asyncio.sleep(0.05)  # spread out: both deliverers poll meanwhile


async def _event_ids(stack: support.Stack) -> list[str]:
    async with support.pg_connection(stack.database_url) as conn:
        found = await conn.fetch(
            "SELECT message_id FROM expiry_events UNION ALL SELECT message_id"
            " FROM expiry_events_sent"
        )
    return [row["message_id"] for row in found]


async def _attempted(stack: support.Stack) -> list[tuple[str, str, int | None]]:
    async with support.pg_connection(stack.database_url) as conn:
        found = await conn.fetch("SELECT message_id, deliverer, status FROM webhook_attempts")
    return [(row["message_id"], row["deliverer"], row["status"]) for row in found]


@pytest.fixture
async def running() -> AsyncIterator[list[Running]]:
    """The deliverers a test starts: killed and their logs closed at its end, whatever."""
    started: list[Running] = []
    yield started
    for each in started:
        each.close()


async def _ready(deliverer: Running, port: int) -> None:
    """Wait for its /readyz (it has checked the schema and registered the endpoint)."""

    async def answers() -> bool:
        assert deliverer.process.returncode is None, (deliverer.name, deliverer.output())
        try:
            async with httpx.AsyncClient(timeout=2) as http:
                return (await http.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200
        except httpx.TransportError:
            return False

    await support.eventually(answers, timeout=60, every=0.2)


@pytest.mark.parametrize("outage", [0.0, 3.0], ids=["healthy", "503-for-3s"])
async def test_the_old_deliverer_beside_the_new_schema_loses_nothing(
    stack: support.Stack, old_release: OldRelease, running: list[Running], outage: float
) -> None:
    """The old deliverer starts first (and registers the endpoint, as it did) and takes
    the first third of the expiries alone; then a current one joins for the rest (with,
    in the second case, the receiver answering 503 to both for ``outage`` seconds meanwhile:
    retries, pauses and probes of the two on the endpoint's shared row). Each event
    delivered at least once, signed; none dead; nothing pending; both exit 0."""
    async with receiving() as receiver:
        ports = {"old": support.free_port(), "new": support.free_port()}
        outage_from = 0.0
        old = await start(
            "old",
            old_release.python,
            old_release.root,
            DELIVER,
            env=_env(stack, receiver, "old", ports["old"]),
        )
        running.append(old)
        await _ready(old, ports["old"])
        await _expire(stack, EVENTS // 3)
        new = await start(
            "new",
            Path(sys.executable),
            support.REPO,
            DELIVER,
            env=_env(stack, receiver, "new", ports["new"]),
        )
        running.append(new)
        await _ready(new, ports["new"])
        if outage:
            outage_from = time.monotonic()
            receiver.down_for(outage, Reply(503))
        await _expire(stack, EVENTS - EVENTS // 3)
        events = await _event_ids(stack)
        assert len(events) == EVENTS

        async def all_delivered() -> bool:
            for each in (old, new):
                assert each.process.returncode is None, (each.name, each.output())
            return set(_answered_2xx(receiver, outage_from)) >= set(events)

        try:
            await support.eventually(all_delivered, timeout=120, every=0.2)
        except TimeoutError:
            pytest.fail(await _stuck(stack, receiver, outage_from, events, old, new))
        codes = {each.name: await each.stop() for each in (old, new)}
    outputs = {each.name: each.output() for each in (old, new)}
    after = [r.at for r in receiver.received if r.at >= max(outage_from, receiver.down_until)]
    silent = f"; silent {min(after) - receiver.down_until:.1f} s after it" if outage else ""
    failed = Counter(r.path for r in receiver.received if outage_from <= r.at < receiver.down_until)
    delivered = _answered_2xx(receiver, outage_from)
    by_path = Counter(path for path, _ in delivered.values())
    extra = {key: len(paths) - 1 for key, (_, paths) in delivered.items()}
    attempted = await _attempted(stack)
    new_2xx = {m for m, who, status in attempted if who == "new-deliverer" and status == 200}
    print(
        f"\n[{outage:g} s of 503] events {len(events)}; requests {len(receiver.received)}; "
        f"first 2xx by {dict(by_path)}; duplicate 2xx: {sum(1 for n in extra.values() if n)} "
        f"event(s), {sum(extra.values())} extra; current deliverer's attempts logged "
        f"{len(attempted)} ({len(new_2xx)} 2xx); 503s {dict(failed)}{silent}"
    )
    assert codes == {"old": 0, "new": 0}, outputs
    for name, output in outputs.items():
        assert "Traceback" not in output, (name, output)
    assert set(receiver.ids()) == set(delivered) == set(events)
    assert all(request.verified for request in receiver.received)
    assert await deliveries(stack) == []  # neither pending nor dead
    assert await dead_letters(stack) == []
    assert by_path["/old"] > 0, "the old deliverer delivered nothing: the test shows nothing"
    assert by_path["/new"] > 0
    # The old one logs no attempt; the current one each of its own.
    assert {who for _, who, _ in attempted} == {"new-deliverer"}
    assert new_2xx == {key for key, (_, paths) in delivered.items() if "/new" in paths}
    if outage:
        assert failed, "no request met the outage"


async def _stuck(
    stack: support.Stack,
    receiver: Receiver,
    outage_from: float,
    events: list[str],
    *running: Running,
) -> str:
    """What is left, when not every event arrived: for the failure's message."""
    async with support.pg_connection(stack.database_url) as conn:
        endpoint = await conn.fetchrow("SELECT * FROM webhook_endpoints")
        left = await conn.fetch(
            "SELECT message_id, attempts, dead, next_at - now() AS due_in, lease_until - now()"
            " AS leased_for, last_status, last_error, since FROM webhook_deliveries"
        )
    missing = set(events) - set(_answered_2xx(receiver, outage_from))
    logs = {each.name: each.output()[-3000:] for each in running}
    return (
        f"{len(missing)} event(s) never answered 2xx; endpoint {dict(endpoint or {})}; "
        f"{len(left)} deliveries left, e.g. {[dict(row) for row in left[:5]]}; "
        f"requests by path {Counter(r.path for r in receiver.received)}; logs {logs}"
    )


def _answered_2xx(receiver: Receiver, outage_from: float) -> dict[str, tuple[str, list[str]]]:
    """Each webhook-id answered 200: the path of its first such request, and of each."""
    answered: dict[str, tuple[str, list[str]]] = {}
    for request in receiver.received:
        if outage_from <= request.at < receiver.down_until:  # answered 503
            continue
        key = request.headers.get("webhook-id", "")
        answered.setdefault(key, (request.path, []))[1].append(request.path)
    return answered
