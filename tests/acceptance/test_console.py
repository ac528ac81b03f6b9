"""The console over HTTP: nobody in unauthenticated, no state change without the session's
CSRF token, only authorised operators replay or close, and the pages' contents."""

from __future__ import annotations

import html
import re
from uuid import uuid4

import pytest

from service.adapters import postgres
from service.adapters.postgres import ownership
from tests.acceptance.console_support import csrf_of, log_in, running_console
from tests.seeding import seed_dead_letters
from tests.support import Stack, pg_connection

pytestmark = pytest.mark.acceptance


async def test_nobody_reaches_the_console_unauthenticated_or_without_the_csrf_token(
    stack: Stack,
) -> None:
    """Pages redirect to the login; a POST without a session is 401; a wrong password is
    401; a body over 64 KiB is 413; a POST without (or with another session's) CSRF token
    is 403 and changes nothing; every answer carries the security headers."""
    await seed_dead_letters(stack)
    async with pg_connection(stack.database_url) as conn:
        record_id = await conn.fetchval("SELECT min(id) FROM dead_letters")
    async with running_console(stack) as console, console.client() as anonymous:
        for path in ("/", "/dead-letters", f"/dead-letters/{record_id}"):
            answer = await anonymous.get(path)
            assert (answer.status_code, answer.headers["location"]) == (303, "/login")
        act = {"action": "note", "key": str(record_id), "text": "x"}
        assert (await anonymous.post("/act", data=act)).status_code == 401
        token = await csrf_of(anonymous, "/login")
        wrong = await anonymous.post(
            "/login", data={"csrf": token, "name": "alice", "password": "nope"}
        )
        assert wrong.status_code == 401
        huge = await anonymous.post(
            "/login",
            content=b"name=" + b"x" * 100_000,
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        assert huge.status_code == 413  # refused before anything parses it
        headers = wrong.headers
        assert "frame-ancestors 'none'" in headers["content-security-policy"]
        assert headers["x-frame-options"] == "DENY"

        async with console.client() as alice, console.client() as other:
            await log_in(alice, "alice")
            await log_in(other, "bob")
            assert (await alice.post("/act", data=act)).status_code == 403
            stolen = await csrf_of(other, "/dead-letters")
            forged = await alice.post("/act", data={**act, "csrf": stolen})
            assert forged.status_code == 403
            async with pg_connection(stack.database_url) as conn:
                assert await conn.fetchval("SELECT count(*) FROM dead_letter_events") == 0
            mine = await csrf_of(alice, "/dead-letters")
            noted = await alice.post("/act", data={**act, "csrf": mine})
            assert noted.status_code == 200, noted.text
            assert "note: 1 selected, 1 done" in noted.text


async def test_only_authorised_operators_replay_or_close_and_every_act_is_audited(
    stack: Stack,
) -> None:
    """eve may look and assign but not close or replay (refused, the replay refusal
    audited); alice closes (the hold parked, shown on the overview) and reopens; the pages
    show the record, the trail and the events, never the message body."""
    [rid] = await seed_dead_letters(stack)
    async with pg_connection(stack.database_url) as conn:
        record_id = await conn.fetchval(
            "SELECT id FROM dead_letters WHERE reservation_id = $1", rid
        )
    async with running_console(stack) as console:
        async with console.client() as eve:
            await log_in(eve, "eve")
            token = await csrf_of(eve, f"/dead-letters/{record_id}")
            base = {"csrf": token, "key": str(record_id)}
            assigned = await eve.post("/act", data={**base, "action": "assign", "text": "eve"})
            assert assigned.status_code == 200, assigned.text
            closed = await eve.post("/act", data={**base, "action": "close", "text": "no"})
            assert closed.status_code == 403
            assert "may not close" in closed.text
            refused = await eve.post("/replay", data={**base, "step": "confirm"})
            assert refused.status_code == 403
        async with console.client() as alice:
            await log_in(alice, "alice")
            token = await csrf_of(alice, f"/dead-letters/{record_id}")
            base = {"csrf": token, "key": str(record_id)}
            plan = await alice.post("/replay", data=base)
            assert plan.status_code == 200
            assert "the hold is held and due: it will expire" in plan.text
            closed = await alice.post(
                "/act", data={**base, "action": "close", "text": "customer cancelled"}
            )
            assert "close: 1 selected, 1 done" in closed.text
            overview = await alice.get("/")
            assert '<strong id="parked">1</strong>' in overview.text
            shown = await alice.get(f"/dead-letters/{record_id}")
            for fact in ("closed", "customer cancelled", "assigned", "db.unavailable"):
                assert fact in shown.text, fact
            poison = await alice.get("/dead-letters/junk-1")
            assert "html" not in poison.text.split("body_excerpt")[1][:200]
    async with pg_connection(stack.database_url) as conn:
        replays = await conn.fetch("SELECT operator, outcome FROM dead_letter_replays")
        events = await conn.fetch("SELECT kind, operator, client_host FROM dead_letter_events")
    assert [(r["operator"], r["outcome"]) for r in replays] == [("eve", "refused")]
    assert [(e["kind"], e["operator"]) for e in events] == [
        ("assigned", "eve"),
        ("closed", "alice"),
    ]
    assert all(e["client_host"] == "127.0.0.1" for e in events)


async def test_a_request_that_selects_nothing_changes_nothing_and_a_group_is_listed_first(
    stack: Stack,
) -> None:
    """Hand-made requests naming neither a dead letter nor a group are refused (400) for every
    act and for a replay, and change nothing; a group's close first lists what it will
    close, and its confirmation closes exactly that list (a forged plan entry is left
    out and named)."""
    await seed_dead_letters(stack, exhausted=2, poison=1)
    async with running_console(stack) as console, console.client() as alice:
        await log_in(alice, "alice")
        token = await csrf_of(alice, "/dead-letters")
        for action in ("assign", "note", "close", "reopen"):
            blank = {"csrf": token, "action": action, "text": "all of them?"}
            answer = await alice.post("/act", data=blank)
            assert answer.status_code == 400, (action, answer.text)
            assert "nothing selected" in answer.text
        for step in ("", "confirm"):
            answer = await alice.post("/replay", data={"csrf": token, "step": step, "plan": ""})
            assert answer.status_code == 400
            assert "nothing selected" in answer.text

        group = {
            "csrf": token,
            "action": "close",
            "scope": "group",
            "error_class": "db.unavailable",
            "text": "won't replay",
        }
        listed = await alice.post("/act", data=group)
        assert listed.status_code == 200, listed.text
        assert listed.text.count("would close") == 2
        assert "close these 2 dead letter(s) now" in listed.text
        plan = listed.text.split('name="plan" value="')[1].split('"')[0]
        async with pg_connection(stack.database_url) as conn:
            poison_id = await conn.fetchval(
                "SELECT id FROM dead_letters WHERE error_class <> $1", "db.unavailable"
            )
        forged = f"{plan},{poison_id}:1"
        done = await alice.post("/act", data={**group, "step": "confirm", "plan": forged})
        assert done.status_code == 200, done.text
        assert "close: 2 selected, 2 done" in done.text
        assert f"left out #{poison_id}" in done.text
    async with pg_connection(stack.database_url) as conn:
        rows = await conn.fetch("SELECT error_class, status FROM dead_letters ORDER BY id")
        replays = await conn.fetchval("SELECT count(*) FROM dead_letter_replays")
        events = await conn.fetch("SELECT kind FROM dead_letter_events")
    assert sorted((r["error_class"], r["status"]) for r in rows) == [
        ("db.unavailable", "closed"),
        ("db.unavailable", "closed"),
        ("poison.not-json", "dead"),
    ]
    assert replays == 0
    assert [e["kind"] for e in events] == ["closed", "closed"]


INSERT_COMMAND_RECORD = """
INSERT INTO dead_letters (message_id, reservation_id, hold_until, error_class, give_up, reason,
                          attempts, first_seen, last_seen, worker)
VALUES ($1, $2, now(), 'db.unavailable', 'attempts-exhausted', 'r', 2, now(), now(), 'w')
RETURNING id
"""


async def _command_records(stack: Stack, *message_ids: str) -> list[int]:
    """Dead letters whose commands a replay rebuilds from their records."""
    async with pg_connection(stack.database_url) as conn:
        return [await conn.fetchval(INSERT_COMMAND_RECORD, m, uuid4()) for m in message_ids]


async def test_acts_an_operator_may_not_do_are_not_offered_and_still_refused(
    stack: Stack,
) -> None:
    """eve, not in EXPIRY_REPLAY_OPERATORS, is offered no replay, close or reopen (on a dead
    letter, on its group, on a replay's dry run) and no sessions page, with a line saying
    why; alice is offered them; eve's hand-made confirmation is still refused (403)."""
    [record_id] = await _command_records(stack, "m-1")
    guarded = ('id="replay-one"', 'id="close"', 'id="reopen"')
    async with running_console(stack) as console:
        async with console.client() as eve:
            await log_in(eve, "eve")
            shown = (await eve.get(f"/dead-letters/{record_id}")).text
            assert not [button for button in guarded if button in shown], shown
            assert 'id="assign"' in shown
            assert 'id="note"' in shown
            assert "'eve' may not replay, close or reopen" in html.unescape(shown)
            assert 'id="may-not"' in shown
            assert 'href="/sessions"' not in shown
            listing = (await eve.get("/dead-letters")).text
            assert 'class="replay-group"' not in listing
            assert 'class="close-group"' not in listing
            assert 'class="assign-group"' in listing
            assert 'id="may-not"' in listing
            token = await csrf_of(eve, "/dead-letters")
            dry = await eve.post("/replay", data={"csrf": token, "key": str(record_id)})
            assert dry.status_code == 200, dry.text
            assert "would-republish" in dry.text
            assert 'id="confirm"' not in dry.text
            assert 'id="may-not"' in dry.text
            plan = f"{record_id}:1"
            confirm = {"csrf": token, "key": str(record_id), "step": "confirm", "plan": plan}
            assert (await eve.post("/replay", data=confirm)).status_code == 403
        async with console.client() as alice:
            await log_in(alice, "alice")
            shown = (await alice.get(f"/dead-letters/{record_id}")).text
            assert all(button in shown for button in guarded)
            assert 'id="may-not"' not in shown
            assert 'href="/sessions"' in shown
            listing = (await alice.get("/dead-letters")).text
            assert 'class="replay-group"' in listing
            assert 'class="close-group"' in listing
            token = await csrf_of(alice, "/dead-letters")
            dry = await alice.post("/replay", data={"csrf": token, "key": str(record_id)})
            assert 'id="confirm"' in dry.text
    async with pg_connection(stack.database_url) as conn:
        replays = await conn.fetch("SELECT operator, outcome FROM dead_letter_replays")
        status = await conn.fetchval("SELECT status FROM dead_letters WHERE id = $1", record_id)
    assert [(r["operator"], r["outcome"]) for r in replays] == [("eve", "refused")]
    assert status == "dead"


async def test_a_confirmation_names_what_changed_in_a_dead_letter_it_leaves_out(
    stack: Stack,
) -> None:
    """A group's replay is dry-run in the console; one of its dead letters is given an owner
    before the confirmation, which replays the other and leaves that one out saying what
    changed and who changed it, not merely its status."""
    first, second = await _command_records(stack, "m-1", "m-2")
    async with running_console(stack) as console, console.client() as alice:
        await log_in(alice, "alice")
        token = await csrf_of(alice, "/dead-letters")
        group = {"csrf": token, "scope": "group", "error_class": "db.unavailable"}
        dry = await alice.post("/replay", data=group)
        assert dry.status_code == 200, dry.text
        form = dict(re.findall(r'name="(\w+)" value="([^"]*)"', dry.text.split("<form")[-1]))
        async with pg_connection(stack.database_url) as conn:
            await ownership.assign(conn, second, "team-db", postgres.Actor("bob", "root", "h"))
        done = await alice.post("/replay", data=form)
        assert done.status_code == 200, done.text
        result = html.unescape(done.text)
        assert f"republished      #{first}" in result
        assert f"left out #{second}" in result
        assert "changed since the dry run: owner set to team-db (by bob)" in result
