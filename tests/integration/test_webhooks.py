"""HTTP delivery of events against real HTTP servers on the loopback (the loopback range
explicitly allowed for them) and the real PostgreSQL: signed and verified by the
Standard Webhooks library's own verifier; each answer as the contract says; the SSRF
guard; the shared rate limit across two deliverers; a paused endpoint beside a healthy
one; a replayed dead delivery comes with its id. (Claims and their settling, statement by
statement: ``test_webhook_claims.py``.)

The deliverer runs in-process here (``service.deliver.deliverer.run``).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from service.adapters import postgres
from service.core import webhook_policy
from service.deliver.deliverer import retire
from tests.events_support import INSERT_EVENTS, insert_events
from tests.support import Stack, as_role, eventually, pg_connection, run_module
from tests.webhook_support import (
    BODY_SECRET,
    Receiver,
    Reply,
    as_text,
    dead_letters,
    deliveries,
    delivering,
    new_secret,
    receiving,
    register,
    running_deliverer,
)

# one_broker: HTTP and PostgreSQL only: the deliverer opens no broker connection.
pytestmark = [pytest.mark.integration, pytest.mark.one_broker]


async def _delivered_all(stack: Stack, timeout: float = 30) -> None:
    async def none_left() -> bool:
        return not [row for row in await deliveries(stack) if not row["dead"]]

    await eventually(none_left, timeout=timeout, every=0.1)


async def _dead(stack: Stack, count: int, timeout: float = 30) -> list[dict[str, object]]:
    async def enough() -> bool:
        return len(await dead_letters(stack)) >= count

    await eventually(enough, timeout=timeout, every=0.1)
    return await dead_letters(stack)


async def test_each_event_is_posted_signed_and_a_2xx_is_done(stack: Stack) -> None:
    """Every event reaches the endpoint once, with its message id as webhook-id, a
    signature the library verifies, and the contract's JSON body; then nothing is left."""
    async with receiving() as receiver:
        stack = delivering(stack, receiver.endpoint())
        await register(stack)
        ids = await insert_events(stack, 5)
        async with running_deliverer(stack):
            await _delivered_all(stack)
    assert sorted(receiver.ids()) == sorted(ids)
    assert all(request.verified for request in receiver.received)
    first = receiver.received[0]
    assert first.headers["content-type"] == "application/json"
    assert b'"event":"reservation.expired"' in first.body
    assert abs(int(first.headers["webhook-timestamp"]) - time.time()) < 60
    assert await dead_letters(stack) == []


async def test_a_500_is_retried_then_delivered(stack: Stack) -> None:
    """500, then 200: two attempts with the same webhook-id, delivered."""
    async with receiving([Reply(500), Reply(200)]) as receiver:
        stack = delivering(stack, receiver.endpoint())
        await register(stack)
        [event] = await insert_events(stack, 1)
        async with running_deliverer(stack):
            await _delivered_all(stack)
    assert receiver.ids() == [event, event]
    assert await dead_letters(stack) == []


async def test_a_429_waits_for_its_retry_after(stack: Stack) -> None:
    """429 with Retry-After: 2: the next attempt comes 2 s later at the earliest."""
    async with receiving([Reply(429, {"retry-after": "2"}), Reply(200)]) as receiver:
        stack = delivering(stack, receiver.endpoint())
        await register(stack)
        await insert_events(stack, 1)
        async with running_deliverer(stack):
            await _delivered_all(stack)
    first, second = receiver.received
    assert second.at - first.at >= 2.0


async def test_a_400_is_tried_again_and_dead_only_out_of_attempts_without_its_body(
    stack: Stack,
) -> None:
    """400 every time: tried again (a failure like any other), then, out of attempts, a
    dead letter of class webhook.rejected naming the endpoint and the status; neither the
    response's body nor the secret nor the URL is kept."""
    async with receiving([Reply(400)]) as receiver:
        endpoint = receiver.endpoint()
        stack = delivering(stack, endpoint, webhook_max_attempts=2)
        await register(stack)
        [event] = await insert_events(stack, 1)
        async with running_deliverer(stack):
            [record] = await _dead(stack, 1)
    assert receiver.ids() == [event, event]
    assert record["error_class"] == webhook_policy.REJECTED
    assert record["give_up"] == webhook_policy.ATTEMPTS_EXHAUSTED
    assert record["message_id"] == webhook_policy.dead_letter_key("orders", event)
    assert str(record["reason"]) == "endpoint orders: HTTP 400"
    kept = as_text(await dead_letters(stack)) + as_text(await deliveries(stack))
    for secret in (BODY_SECRET, endpoint.secret[0].get_secret_value(), endpoint.url):
        assert secret not in kept
    [row] = await deliveries(stack)
    assert (row["dead"], row["last_status"]) == (True, 400)


async def test_a_redirect_is_not_followed_but_tried_again(stack: Stack) -> None:
    """302 to another path: never the redirect's target, a failure tried again at the
    endpoint's URL, which then delivers it."""
    async with receiving([Reply(302, {"location": "/elsewhere"}), Reply(200)]) as receiver:
        stack = delivering(stack, receiver.endpoint())
        await register(stack)
        [event] = await insert_events(stack, 1)
        async with running_deliverer(stack):
            await _delivered_all(stack)
    assert [request.path for request in receiver.received] == ["/hook", "/hook"]
    assert receiver.ids() == [event, event]
    assert await dead_letters(stack) == []


@pytest.mark.parametrize(
    ("url", "allow"),
    [
        ("https://localhost:{port}/hook", []),  # a name that resolves to the loopback
        ("https://127.0.0.1:{port}/hook", []),  # the address itself
        ("http://127.0.0.1:{port}/hook", ["10.0.0.0/8"]),  # another range allowed
    ],
)
async def test_an_address_not_allowed_is_refused(stack: Stack, url: str, allow: list[str]) -> None:
    """The receiver on the loopback, which the endpoint does not allow: no request reaches
    it, and the delivery, out of attempts (one here), is a dead letter of class
    webhook.not-allowed."""
    async with receiving() as receiver:
        endpoint = receiver.endpoint(url=url.format(port=receiver.port), allow_networks=allow)
        stack = delivering(stack, endpoint, webhook_max_attempts=1)
        await register(stack)
        await insert_events(stack, 1)
        async with running_deliverer(stack):
            [record] = await _dead(stack, 1)
    assert receiver.received == []
    assert record["error_class"] == webhook_policy.NOT_ALLOWED


async def test_a_slow_endpoint_times_out_and_is_retried(stack: Stack) -> None:
    """The first answer comes after the endpoint's timeout: timed out, tried again, and
    the second (fast) attempt delivers it."""
    async with receiving([Reply(200, delay=3.0), Reply(200)]) as receiver:
        stack = delivering(stack, receiver.endpoint(timeout_seconds=0.5))
        await register(stack)
        [event] = await insert_events(stack, 1)
        async with running_deliverer(stack):
            await _delivered_all(stack)
    assert receiver.ids() == [event, event]


async def test_two_deliverers_keep_to_the_shared_rate(stack: Stack) -> None:
    """Two deliverers against one endpoint limited to 50/s: 50/s ± 10% in total."""
    count = 300
    async with receiving() as receiver:
        stack = delivering(stack, receiver.endpoint(rate_per_second=50))
        await register(stack)
        await insert_events(stack, count)
        async with running_deliverer(stack), running_deliverer(stack):
            await _delivered_all(stack, timeout=60)
    arrivals = sorted(request.at for request in receiver.received)
    assert len(arrivals) == count
    rate = (count - 1) / (arrivals[-1] - arrivals[0])
    assert 45 <= rate <= 55, f"{rate:.1f}/s"


async def test_a_paused_endpoint_does_not_slow_another(stack: Stack) -> None:
    """One endpoint answers 503 every time, the other 200: the failing one pauses (its
    requests stop well short of one per event), the healthy one gets everything at once."""
    async with receiving([Reply(503)]) as failing, receiving() as healthy:
        stack = delivering(
            stack,
            failing.endpoint("failing"),
            healthy.endpoint("healthy"),
            webhook_pause_after=3,
            webhook_pause_seconds=30.0,
        )
        await register(stack)
        ids = await insert_events(stack, 40)
        started = time.monotonic()
        async with running_deliverer(stack):

            async def healthy_done() -> bool:
                return sorted(set(healthy.ids())) == sorted(ids)

            await eventually(healthy_done, timeout=20, every=0.1)
            took = time.monotonic() - started
            async with pg_connection(stack.database_url) as conn:
                paused = await conn.fetchval(
                    "SELECT paused_until > now() FROM webhook_endpoints WHERE name = 'failing'"
                )
    assert paused is True
    assert len(failing.received) < len(ids)
    assert took < 10


async def test_a_replayed_dead_delivery_comes_with_the_same_id(stack: Stack) -> None:
    """400, dead (out of its one attempt); replayed by an operator with the command (as
    expiry_operator, audited, no broker reachable: none is needed); the receiver now
    answers 200: the event arrives again with its webhook-id, and the dead letter reads
    replayed."""
    async with receiving([Reply(400), Reply(200)]) as receiver:
        stack = delivering(stack, receiver.endpoint(), webhook_max_attempts=1)
        await register(stack)
        [event] = await insert_events(stack, 1)
        async with running_deliverer(stack):
            [record] = await _dead(stack, 1)
            env = stack.env(
                DATABASE_URL=as_role(stack.database_url, "expiry_operator"),
                EXPIRY_REPLAY_OPERATORS="alice",
                AMQP_URL="amqp://guest:guest@127.0.0.1:1/",  # a delivery's needs no broker
            )
            replayed = await asyncio.to_thread(
                run_module,
                "service.deadletters",
                "replay",
                str(record["id"]),
                "--operator",
                "alice",
                env=env,
            )
            assert replayed.returncode == 0, replayed.stdout + replayed.stderr
            assert "redelivering" in replayed.stdout
            await _delivered_all(stack)

            async def arrived_again() -> bool:
                return receiver.ids() == [event, event]

            await eventually(arrived_again, timeout=10, every=0.1)
    [after] = await dead_letters(stack)
    assert after["status"] == "replayed"
    async with pg_connection(stack.database_url) as conn:
        audit = await conn.fetch("SELECT operator, outcome FROM dead_letter_replays")
    assert [tuple(row) for row in audit] == [("alice", postgres.REDELIVERING)]


async def test_a_retire_waits_for_an_expiry_in_flight_and_leaves_no_delivery_behind(
    stack: Stack,
) -> None:
    """An expiry's transaction has written its event (and its trigger a delivery per
    endpoint) and not committed yet: --retire waits for it, then deletes that delivery
    too; an expiry after the retire writes none for the endpoint."""
    endpoint = Receiver(new_secret(), port=9).endpoint("gone")
    stack = delivering(stack, endpoint, lock_timeout_ms=30_000)  # waits, whatever the load
    await register(stack)
    async with pg_connection(stack.database_url) as expiry:
        in_flight = expiry.transaction()
        await in_flight.start()
        await expiry.fetch(INSERT_EVENTS, 1, None)  # the trigger read the endpoints
        said: list[str] = []
        retiring = asyncio.create_task(retire(stack.settings, "gone", yes=True, say=said.append))
        await asyncio.sleep(0.5)
        assert not retiring.done()  # it waits for the expiry in flight
        await in_flight.commit()
        assert await retiring == 0
    assert said[-1].startswith("retired endpoint gone: 1 pending and 0 dead deliveries deleted")
    await insert_events(stack, 1)
    assert await deliveries(stack) == []
