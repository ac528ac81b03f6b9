"""Receivers on their bad days, against the real deliverer (in-process) and real HTTP
receivers on the loopback: one down for a while (503, or 401 after a secret rotation)
gets every event once it is back, through the pause and its probe; a 429 storm with
``Retry-After`` holds back the whole endpoint, not one delivery; a 410 Gone disables
the endpoint, nothing is sent until ``--enable``, and then everything is, the time it
was disabled left out of the deliveries' age.
"""

from __future__ import annotations

import logging

import pytest

from service.adapters.postgres import webhook_endpoints
from service.deliver import courier
from service.deliver.deliverer import enable
from service.settings import Settings
from tests.events_support import insert_events
from tests.support import Stack, eventually, pg_connection
from tests.webhook_support import (
    Reply,
    attempts,
    dead_letters,
    deliveries,
    delivering,
    receiving,
    register,
    running_deliverer,
)

# one_broker: HTTP and PostgreSQL only: the deliverer opens no broker connection.
pytestmark = [pytest.mark.integration, pytest.mark.one_broker]

# Quick pauses and retries, so that a few seconds of outage go through every step.
QUICK = {
    "webhook_pause_after": 3,
    "webhook_pause_seconds": 0.5,
    "webhook_pause_cap_seconds": 2.0,
    "webhook_backoff_seconds": 0.2,
    "webhook_backoff_cap_seconds": 1.0,
}


async def _none_pending(stack: Stack) -> bool:
    return not [row for row in await deliveries(stack) if not row["dead"]]


def _events(caplog: pytest.LogCaptureFixture, name: str) -> int:
    return sum(1 for record in caplog.records if record.msg == name)


@pytest.mark.parametrize("status", [503, 401])
async def test_a_receiver_down_for_a_while_gets_every_event_once_it_is_back(
    stack: Stack, caplog: pytest.LogCaptureFixture, status: int
) -> None:
    """Down for 3 s (503; or 401, as after a secret rotation it does not know yet): the
    endpoint pauses after failures in a row, probes when each pause ends, and resumes
    on the first 2xx; every event arrives, none is dead."""
    caplog.set_level(logging.INFO, "service.deliver")
    async with receiving() as receiver:
        stack = delivering(stack, receiver.endpoint(), **QUICK)
        await register(stack)
        receiver.down_for(3.0, Reply(status))
        ids = await insert_events(stack, 30)
        async with running_deliverer(stack):
            await eventually(lambda: _none_pending(stack), timeout=60)
    back = {r.headers["webhook-id"] for r in receiver.received if r.at >= receiver.down_until}
    assert back == set(ids)
    assert await dead_letters(stack) == []
    assert _events(caplog, "webhook.paused") >= 1
    assert _events(caplog, "webhook.probe") >= 1
    logged = await attempts(stack)  # every request is in the attempt log, probes as such
    assert len(logged) == len(receiver.received)
    assert {row["kind"] for row in logged} == {"automatic", "probe"}
    assert {row["status"] for row in logged} == {status, 200}


# The pause and the backoff as shipped (delivering() makes them quick).
SHIPPED = {
    name: Settings.model_fields[name].default
    for name in (
        "webhook_backoff_seconds",
        "webhook_backoff_cap_seconds",
        "webhook_pause_after",
        "webhook_pause_seconds",
        "webhook_pause_cap_seconds",
    )
}


@pytest.mark.slow
@pytest.mark.parametrize(("status", "seconds"), [(503, 15.0), (401, 10.0)])
async def test_the_issues_outages_at_full_length_with_the_shipped_pause_and_backoff(
    stack: Stack, caplog: pytest.LogCaptureFixture, status: int, seconds: float
) -> None:
    """Issue 44's outages as long as it names them, with the pause and the backoff as
    shipped: down 15 s answering 503, and 401 for 10 s (a rotation the receiver has not
    caught up with). Every event arrives once the receiver is back, none is dead, and the
    endpoint paused and probed on the way (a minute or two: marked slow)."""
    caplog.set_level(logging.INFO, "service.deliver")
    async with receiving() as receiver:
        stack = delivering(stack, receiver.endpoint(), **SHIPPED)
        await register(stack)
        receiver.down_for(seconds, Reply(status))
        ids = await insert_events(stack, 30)
        async with running_deliverer(stack):
            await eventually(lambda: _none_pending(stack), timeout=300, every=0.5)
    back = {r.headers["webhook-id"] for r in receiver.received if r.at >= receiver.down_until}
    assert back == set(ids)
    assert await dead_letters(stack) == []
    assert _events(caplog, "webhook.paused") >= 1
    assert {row["status"] for row in await attempts(stack)} == {status, 200}


async def test_a_429_storm_holds_back_the_whole_endpoint_for_its_retry_after(
    stack: Stack,
) -> None:
    """The first answers are 429 with Retry-After: 2: apart from the attempts already in
    flight, nothing reaches the endpoint for 2 s (every delivery waits, not only those
    answered); then every event arrives, none dead."""
    concurrency, count = 4, 20
    storm = [Reply(429, {"retry-after": "2"})] * concurrency
    async with receiving([*storm, Reply(200)]) as receiver:
        endpoint = receiver.endpoint(rate_per_second=1000)
        stack = delivering(stack, endpoint, webhook_concurrency=concurrency)
        await register(stack)
        ids = await insert_events(stack, count)
        async with running_deliverer(stack):
            await eventually(lambda: _none_pending(stack), timeout=60)
    arrivals = sorted(request.at for request in receiver.received)
    first = arrivals[0]
    held_back = [at for at in arrivals if at < first + 2.0]
    assert len(held_back) <= concurrency, [round(at - first, 3) for at in arrivals]
    assert set(receiver.ids()) == set(ids)
    assert await dead_letters(stack) == []


async def test_a_410_disables_the_endpoint_until_it_is_enabled(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """410 Gone: the endpoint is disabled, nothing more is sent to it and its deliveries
    wait (none dead, their age stopped); --enable makes them due, and every event
    arrives."""
    monkeypatch.setattr(courier, "DISABLED_LOOK_SECONDS", 0.2)
    async with receiving([Reply(410), Reply(200)]) as receiver:
        stack = delivering(stack, receiver.endpoint(), webhook_concurrency=1)
        await register(stack)
        ids = await insert_events(stack, 5)
        async with running_deliverer(stack):

            async def disabled() -> bool:
                async with pg_connection(stack.database_url) as conn:
                    [row] = await webhook_endpoints.backlog(conn)
                return row.disabled_at is not None

            await eventually(disabled, timeout=30)
            await eventually(lambda: _disabled_for(stack, 2.0), timeout=30)
            assert len(receiver.received) == 1  # the 410, and nothing since
            pending = await deliveries(stack)
            assert (len(pending), [row["dead"] for row in pending]) == (5, [False] * 5)
            oldest, disabled_for = await _oldest_age_and_disabled_for(stack)
            said: list[str] = []
            assert await enable(stack.settings, "orders", say=said.append) == 0
            assert said[0].startswith("enabled endpoint orders (disabled since ")
            assert "its 5 waiting deliveries are due now" in said[0]
            after, _ = await _oldest_age_and_disabled_for(stack)
            # The time it was disabled (2 s at least) is taken off their age budget.
            assert after <= oldest - disabled_for + 1.0
            assert after < oldest - 1.0
            await eventually(lambda: _none_pending(stack), timeout=30)
            said.clear()
            assert await enable(stack.settings, "orders", say=said.append) == 0
            assert said == ["endpoint orders was not disabled: nothing changed"]
    assert receiver.ids()[0] in ids
    assert sorted(receiver.ids()[1:]) == sorted(ids)
    assert await dead_letters(stack) == []


async def _disabled_for(stack: Stack, seconds: float) -> bool:
    """Whether the endpoint has been disabled for ``seconds`` at least."""
    _, disabled_for = await _oldest_age_and_disabled_for(stack)
    return disabled_for >= seconds


async def _oldest_age_and_disabled_for(stack: Stack) -> tuple[float, float]:
    """The oldest pending delivery's age (its budget's) and how long the endpoint has been
    disabled (0: it is not), read at one moment of the database's clock."""
    async with pg_connection(stack.database_url) as conn:
        row = await conn.fetchrow(
            "SELECT coalesce((SELECT max(extract(epoch FROM clock_timestamp() - since))"
            "                   FROM webhook_deliveries WHERE NOT dead), 0)::float8 AS oldest,"
            "       coalesce((SELECT extract(epoch FROM clock_timestamp() - disabled_at)"
            "                   FROM webhook_endpoints), 0)::float8 AS disabled_for"
        )
    assert row is not None
    return row["oldest"], row["disabled_for"]
