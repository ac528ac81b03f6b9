"""``python -m service.deliver`` as a user runs it: the refusals at its start (one line,
exit 2, never a secret), events delivered to a receiver on the loopback as the role
expiry_deliver, its endpoint, and SIGTERM with an attempt in flight (settled, exit 0)."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import httpx
import pytest

from service.adapters import postgres
from tests import support
from tests.acceptance.processes import run, start, stop
from tests.events_support import insert_events
from tests.support import eventually
from tests.webhook_support import (
    LOOPBACK,
    Reply,
    attempts,
    deliveries,
    delivering,
    new_secret,
    receiving,
    register,
    running_deliverer,
)

# one_broker: HTTP and PostgreSQL only: the deliverer opens no broker connection.
pytestmark = [pytest.mark.acceptance, pytest.mark.one_broker]

DELIVER = "service.deliver"


def _env(stack: support.Stack, endpoints: list[dict[str, object]], **extra: str) -> dict[str, str]:
    """The stack's environment, as the role expiry_deliver, with these endpoints."""
    env = stack.env(
        DATABASE_URL=support.as_role(stack.database_url, "expiry_deliver"),
        EXPIRY_WEBHOOKS=json.dumps(endpoints),
        EXPIRY_WEBHOOK_POLL_SECONDS="0.1",
        **extra,
    )
    return env


@pytest.mark.parametrize(
    ("given", "extra", "said"),
    [
        ([], {}, "EXPIRY_WEBHOOKS (or EXPIRY_WEBHOOKS_FILE) names no endpoint"),
        (
            [{"name": "a", "url": "https://h.example/", "secret": "whsec_dG9vc2hvcnQ="}],
            {},
            "EXPIRY_WEBHOOKS: endpoint 1 ('a'): secret: must be",
        ),
        (
            [{"name": "a", "url": "https://h.example/", "secret": "@", "timeout_seconds": 60}],
            {},
            "EXPIRY_WEBHOOKS: endpoint 1 ('a'): secret",
        ),
        (
            [{"name": "a", "url": "https://h.example/", "timeout_seconds": 60}],
            {"EXPIRY_WEBHOOK_LEASE_SECONDS": "30"},
            "EXPIRY_WEBHOOK_LEASE_SECONDS (30) must exceed",
        ),
    ],
)
async def test_it_refuses_what_it_cannot_work_with_in_one_line(
    stack: support.Stack, given: list[dict[str, object]], extra: dict[str, str], said: str
) -> None:
    """No endpoint, a bad secret, a lease shorter than a timeout: one line naming the
    setting, exit 2, no traceback, and never the secret."""
    secret = new_secret()
    for endpoint in given:
        endpoint.setdefault("secret", secret)
    result = await asyncio.to_thread(run, DELIVER, env=_env(stack, given, **extra))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert said in lines[0]
    assert secret.removeprefix("whsec_") not in result.stderr + result.stdout


async def test_it_delivers_as_its_role_serves_its_endpoint_and_stops_with_zero(
    stack: support.Stack,
) -> None:
    """Events delivered to the loopback receiver, signed; /readyz 200 and the metrics;
    SIGTERM while an attempt is in flight: that attempt is settled, then exit 0."""
    async with receiving([Reply(200)]) as receiver:
        endpoint = {
            "name": "orders",
            "url": receiver.url(),
            "secret": receiver.secret,
            "allow_networks": LOOPBACK,
            "timeout_seconds": 5,
        }
        port = support.free_port()
        deliverer = await start(DELIVER, env=_env(stack, [endpoint], EXPIRY_HTTP_PORT=str(port)))
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
                await support.until_ready(http)
                ids = await insert_events(stack, 20)

                async def all_delivered() -> bool:
                    return sorted(set(receiver.ids())) == sorted(ids)

                await support.eventually(all_delivered, timeout=30)
                metrics = (await http.get("/metrics")).text
            receiver.script[:] = [Reply(200, delay=2.0)]
            [slow] = await insert_events(stack, 1)

            async def in_flight() -> bool:
                return slow in receiver.ids()

            await support.eventually(in_flight, timeout=30, every=0.05)
            [arrived] = [r.at for r in receiver.received if r.headers.get("webhook-id") == slow]
            signalled = time.monotonic()
        finally:
            code, output = await stop(deliverer, signal.SIGTERM)
        exited = time.monotonic()
        took = exited - signalled
    assert code == 0, output
    assert receiver.url() not in output  # httpx's line per request names it: kept quiet
    assert receiver.secret.removeprefix("whsec_") not in output
    assert all(request.verified for request in receiver.received)
    assert 'expiry_webhook_delivered_total{endpoint="orders"' in metrics
    assert await deliveries(stack) == []  # the slow one too: settled before the exit
    # It exited after the slow answer, 2 s after the request arrived (however late the test
    # saw it arrive and signalled), and soon after that.
    assert exited - arrived >= 2.0, (exited - arrived, took)
    assert took < 10, took


async def test_retire_shows_then_deletes_an_endpoint_and_its_deliveries(
    stack: support.Stack,
) -> None:
    """--retire NAME shows the endpoint's pending and dead deliveries and changes nothing;
    with --yes they go, and no delivery is written for it any more; an unknown name is
    refused in one line (exit 2)."""
    async with support.pg_connection(stack.database_url) as conn:
        await conn.execute("INSERT INTO webhook_endpoints (name) VALUES ('gone'), ('kept')")
    await insert_events(stack, 3)
    env = _env(stack, [])
    shown = await asyncio.to_thread(run, DELIVER, "--retire", "gone", env=env)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == [
        "endpoint gone: 3 pending and 0 dead deliveries",
        "nothing done: --yes retires it (its dead letters stay)",
    ]
    assert len(await deliveries(stack)) == 6
    done = await asyncio.to_thread(run, DELIVER, "--retire", "gone", "--yes", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].startswith(
        "retired endpoint gone: 3 pending and 0 dead deliveries deleted"
    )
    await insert_events(stack, 1)
    assert {row["endpoint"] for row in await deliveries(stack)} == {"kept"}
    unknown = await asyncio.to_thread(run, DELIVER, "--retire", "nobody", env=env)
    assert unknown.returncode == 2
    assert unknown.stderr.strip() == (
        "python -m service.deliver: refused: --retire: no endpoint 'nobody' is registered"
    )


async def test_enable_sends_to_a_disabled_endpoint_again_as_the_deliverer(
    stack: support.Stack,
) -> None:
    """--enable NAME, as expiry_deliver with no endpoint configured: a disabled endpoint
    is enabled and its waiting deliveries due now; again, nothing changes; an unknown
    name is refused in one line (exit 2); --enable and --retire together, by argparse."""
    async with support.pg_connection(stack.database_url) as conn:
        await conn.execute(
            "INSERT INTO webhook_endpoints (name, disabled_at) VALUES ('crm', now())"
        )
    await insert_events(stack, 2)
    env = _env(stack, [])
    enabled = await asyncio.to_thread(run, DELIVER, "--enable", "crm", env=env)
    assert enabled.returncode == 0, enabled.stderr
    [line] = enabled.stdout.splitlines()
    assert line.startswith("enabled endpoint crm (disabled since ")
    assert line.endswith(
        "its 2 waiting deliveries are due now, the time it was disabled left out of their age"
    )
    async with support.pg_connection(stack.database_url) as conn:
        assert await conn.fetchval("SELECT disabled_at FROM webhook_endpoints") is None
    again = await asyncio.to_thread(run, DELIVER, "--enable", "crm", env=env)
    assert again.stdout.splitlines() == ["endpoint crm was not disabled: nothing changed"]
    unknown = await asyncio.to_thread(run, DELIVER, "--enable", "nobody", env=env)
    assert unknown.returncode == 2
    assert unknown.stderr.strip() == (
        "python -m service.deliver: refused: --enable: no endpoint 'nobody' is registered"
    )
    both = await asyncio.to_thread(run, DELIVER, "--enable", "crm", "--retire", "crm", env=env)
    assert both.returncode == 2
    assert "not allowed with argument" in both.stderr


async def test_backfill_sends_an_endpoint_the_events_written_before_it(
    stack: support.Stack,
) -> None:
    """Three expiries before an endpoint was registered (no delivery for it); --backfill,
    as the operator's role, by a named replay operator: the three queued (their origin and
    attempts say backfill), audited, and a deliverer sends them with their ids; again:
    nothing queued twice; refused in one line without --operator, for an endpoint not
    registered, or for a time that is none."""
    ids = await support.insert_holds(stack.database_url, 3)
    async with support.pg_connection(stack.database_url) as conn:
        await postgres.expire_batch(conn, ids, ["a", "b", "c"], [1, 1, 1], worker="w")
        events = [
            row["message_id"] for row in await conn.fetch("SELECT message_id FROM expiry_events")
        ]
    async with receiving() as receiver:
        late = delivering(stack, receiver.endpoint("late"))
        await register(late)
        env = stack.env(
            DATABASE_URL=support.as_role(stack.database_url, "expiry_operator"),
            EXPIRY_REPLAY_OPERATORS="alice",
        )
        asked = ("--backfill", "late", "--since", "1h")
        done = await asyncio.to_thread(run, DELIVER, *asked, "--operator", "alice", env=env)
        assert done.returncode == 0, done.stderr
        [line] = done.stdout.splitlines()
        assert line.startswith("backfill of endpoint late from ")
        assert "3 event(s) queued, of 3 kept (0 already waiting for it)" in line
        again = await asyncio.to_thread(run, DELIVER, *asked, "--operator", "alice", env=env)
        assert "0 event(s) queued, of 3 kept (3 already waiting for it)" in again.stdout
        async with running_deliverer(late):

            async def arrived() -> bool:
                return sorted(receiver.ids()) == sorted(events)

            await eventually(arrived)
    kinds = {row["kind"] for row in await attempts(stack)}
    assert kinds == {"backfill"}
    async with support.pg_connection(stack.database_url) as conn:
        audit = await conn.fetch(
            "SELECT kind, target, events, outcome, operator FROM history_requests ORDER BY id"
        )
    assert [tuple(row) for row in audit] == [
        ("backfill", "late", 3, "done", "alice"),
        ("backfill", "late", 0, "done", "alice"),
    ]
    for args, said in [
        ((*asked,), "this needs --operator NAME"),
        (("--backfill", "nobody", "--since", "1h", "--operator", "alice"), "no endpoint 'nobody'"),
        (("--backfill", "late", "--since", "soon", "--operator", "alice"), "'soon' is not a time"),
        (("--backfill", "late", "--operator", "alice"), "--backfill needs --since TIME"),
    ]:
        refused = await asyncio.to_thread(run, DELIVER, *args, env=env)
        assert refused.returncode == 2, (args, refused.stdout, refused.stderr)
        [line] = refused.stderr.splitlines()
        assert line.startswith("python -m service.deliver: refused: ")
        assert said in line, line


async def test_migrate_registers_the_endpoints_before_any_deliverer_runs(
    stack: support.Stack,
) -> None:
    """migrate given EXPIRY_WEBHOOKS registers its endpoints: the next expiry, with no
    deliverer ever started, has its delivery to each of them."""
    endpoints = [
        {"name": "crm", "url": "https://crm.example.com/hooks", "secret": new_secret()},
        {"name": "stock", "url": "https://stock.example.com/in", "secret": new_secret()},
    ]
    env = stack.env(EXPIRY_WEBHOOKS=json.dumps(endpoints))
    migrated = await asyncio.to_thread(run, "service.migrate", env=env)
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.splitlines()[-1] == (
        "webhook endpoints registered: crm, stock (a delivery is written for each expiry from "
        "now on)"
    )
    [rid] = await support.insert_holds(stack.database_url, 1)
    async with support.pg_connection(stack.database_url) as conn:
        await postgres.expire_batch(conn, [rid], ["a"], [1], worker="w")
    assert sorted(row["endpoint"] for row in await deliveries(stack)) == ["crm", "stock"]
