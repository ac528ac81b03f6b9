"""The attempt log as an operator reads it: ``python -m service.attempts EVENT`` (as
expiry_operator) and the console's events page say, endpoint by endpoint, every attempt
(when, which, what made it, the answer, how long, by whom) and where each delivery
stands, for an event named by its message id or by its reservation id."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from tests import support
from tests.acceptance.console_support import log_in, running_console
from tests.acceptance.processes import run
from tests.events_support import insert_events
from tests.support import Stack, eventually, pg_connection
from tests.webhook_support import (
    Reply,
    deliveries,
    delivering,
    receiving,
    register,
    running_deliverer,
)

# one_broker: PostgreSQL and HTTP only.
pytestmark = [pytest.mark.acceptance, pytest.mark.one_broker]

ATTEMPT = re.compile(
    r"^    \d{4}-\d\d-\d\dT[\d:.]+\+00:00  #(\d)  (\w+) +(HTTP \d+|no answer)(, [\w.-]+)?, "
    r"[\d.]+ ms, by [\w:.-]+$"
)


async def _delivered_once_after_a_503(stack: Stack) -> tuple[Stack, str]:
    """An endpoint crm that answered 503 then 200 to one event; then an endpoint late,
    registered after it."""
    async with receiving([Reply(503), Reply(200)]) as receiver:
        stack = delivering(stack, receiver.endpoint("crm"))
        await register(stack)
        [event] = await insert_events(stack, 1)
        async with running_deliverer(stack):

            async def none_left() -> bool:
                return await deliveries(stack) == []

            await eventually(none_left)
    async with pg_connection(stack.database_url) as conn:
        await conn.execute("INSERT INTO webhook_endpoints (name) VALUES ('late')")
    return stack, event


async def test_the_command_tells_each_endpoints_attempts_of_an_event(stack: Stack) -> None:
    """By message id or by reservation id, as the operator: crm delivered after two
    attempts (the 503 and the 200, each with when, number, kind, status, class, time,
    deliverer), late registered after the event; --json the same; an unknown event: exit 1
    and one line."""
    stack, event = await _delivered_once_after_a_503(stack)
    env = stack.env(DATABASE_URL=support.as_role(stack.database_url, "expiry_operator"))
    shown = await asyncio.to_thread(run, "service.attempts", event, env=env)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith(f"event {event} (reservation ")
    assert lines[1] == "  crm: delivered, after 2 attempt(s)"
    found = [ATTEMPT.match(line) for line in lines[2:4]]
    assert [(m.group(1), m.group(2), m.group(3), m.group(4)) for m in found if m] == [
        ("1", "automatic", "HTTP 503", ", webhook.unavailable"),
        ("2", "automatic", "HTTP 200", None),
    ]
    assert lines[4].startswith("  late: no delivery: registered after this event was written")
    reservation = event.split(":")[1]
    by_reservation = await asyncio.to_thread(run, "service.attempts", reservation, env=env)
    assert by_reservation.stdout == shown.stdout
    data = json.loads(
        (await asyncio.to_thread(run, "service.attempts", event, "--json", env=env)).stdout
    )
    [story] = data
    assert story["message_id"] == event
    crm, late = story["endpoints"]
    assert (crm["state"], [a["status"] for a in crm["attempts"]]) == ("delivered", [503, 200])
    assert late == {
        "endpoint": "late",
        "state": "registered-later",
        "next_at": None,
        "attempts": [],
    }
    unknown = await asyncio.to_thread(run, "service.attempts", "expired:nothing:1", env=env)
    assert unknown.returncode == 1
    assert unknown.stdout.startswith("no event 'expired:nothing:1' is kept")


async def test_the_console_shows_an_events_attempts(stack: Stack) -> None:
    """The events page, asked for the event: each endpoint's state and its attempts, as
    the command says them."""
    stack, event = await _delivered_once_after_a_503(stack)
    async with running_console(stack) as console, console.client() as client:
        await log_in(client, "eve")
        page = (await client.get("/events", params={"id": event})).text
        empty = (await client.get("/events", params={"id": "expired:nothing:1"})).text
    assert f'<h2 class="event">{event}</h2>' in page
    assert 'data-endpoint="crm" data-state="delivered"' in page
    assert "crm: delivered, after 2 attempt(s)" in page
    assert page.count('<tr class="attempt">') == 2
    assert "HTTP 503, webhook.unavailable" in page
    assert 'data-endpoint="late" data-state="registered-later"' in page
    assert 'id="not-kept"' in empty
