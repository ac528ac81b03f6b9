"""The console against an attacker, over real HTTP against ``python -m service.console``
and its database: guessing is slowed, then locked, and the lock lifts by itself; every
login is audited and the overview shows the failures; sessions end at logout, at their
timeouts, when ended from the command line or the sessions page, and when a password
changes; input PostgreSQL would refuse is answered 400 before it gets there, and every
answer carries the security headers."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import pytest
import uvicorn
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from service.adapters.postgres import console as console_store
from service.console import protocol
from service.console.app import create_app
from service.console.auth import hash_password
from tests.acceptance.console_support import (
    PASSWORDS,
    csrf_of,
    log_in,
    running_console,
    users,
)
from tests.support import Stack, free_port, pg_connection, run_module

# one_broker: logins, sessions and input checks: HTTP and PostgreSQL only.
pytestmark = [pytest.mark.acceptance, pytest.mark.one_broker]

SESSION = "expiry_console"
LOCK_SECONDS = 8
FAST_LOCK = {
    "EXPIRY_CONSOLE_LOGIN_ATTEMPTS": "5",
    "EXPIRY_CONSOLE_LOGIN_LOCK_SECONDS": str(LOCK_SECONDS),
}


def _has_security_headers(answer: httpx.Response) -> bool:
    headers = answer.headers
    return (
        "frame-ancestors 'none'" in headers.get("content-security-policy", "")
        and headers.get("x-frame-options") == "DENY"
        and headers.get("x-content-type-options") == "nosniff"
        and headers.get("cache-control") == "no-store"
    )


async def _guess(client: httpx.AsyncClient, name: str, password: str) -> httpx.Response:
    token = await csrf_of(client, "/login")
    return await client.post("/login", data={"csrf": token, "name": name, "password": password})


async def _logins(stack: Stack) -> list[tuple[str, str]]:
    async with pg_connection(stack.database_url) as conn:
        rows = await conn.fetch("SELECT name, outcome FROM console_logins ORDER BY id")
    return [(row["name"], row["outcome"]) for row in rows]


async def test_a_guessing_loop_is_slowed_then_locked_and_the_lock_lifts_by_itself(
    stack: Stack,
) -> None:
    """Five failures lock alice from this address for 8 s (as configured): the first three
    are checked at once, then each waits (429 with Retry-After); during the lock the right
    password is refused with a clear message and no session; after it, it gets in. Every
    attempt is audited; the overview shows the failures."""
    async with running_console(stack, **FAST_LOCK) as console, console.client() as attacker:
        statuses = [(await _guess(attacker, "alice", f"wrong-{i}")).status_code for i in range(3)]
        assert statuses == [401, 401, 401]
        slowed = await _guess(attacker, "alice", "wrong-3")
        assert slowed.status_code == 429, slowed.text
        assert int(slowed.headers["retry-after"]) >= 1
        assert "too many failed logins for this name from this address" in slowed.text
        assert _has_security_headers(slowed)
        for _ in range(10):  # obey Retry-After (1 s, 2 s) until the lock
            await asyncio.sleep(float(slowed.headers.get("retry-after", "0")))
            slowed = await _guess(attacker, "alice", "wrong-again")
            assert slowed.status_code in (401, 429), slowed.text
            if slowed.status_code == 429 and int(slowed.headers["retry-after"]) > 2:
                break
        assert slowed.status_code == 429
        assert int(slowed.headers["retry-after"]) in (LOCK_SECONDS - 1, LOCK_SECONDS)
        locked_at = time.monotonic()
        right = await _guess(attacker, "alice", PASSWORDS["alice"])
        assert right.status_code == 429
        assert "too many failed logins for this name from this address: try again in" in right.text
        assert SESSION not in right.cookies
        async with console.client() as elsewhere:  # another name from this address: not locked
            await log_in(elsewhere, "bob")
        await asyncio.sleep(max(0.0, LOCK_SECONDS + 0.2 - (time.monotonic() - locked_at)))
        lifted = await _guess(attacker, "alice", PASSWORDS["alice"])
        assert lifted.status_code == 303, lifted.text
        overview = await attacker.get("/")
        assert 'id="login-failures"' in overview.text
    logins = await _logins(stack)
    assert [outcome for name, outcome in logins if name == "alice"][:4] == [
        "failed",
        "failed",
        "failed",
        "refused",
    ]
    assert logins[-1] == ("alice", "ok")
    assert sum(1 for name, outcome in logins if name == "alice" and outcome == "failed") == 5


async def test_a_burst_of_parallel_guesses_is_weighed_one_by_one(stack: Stack) -> None:
    """20 guesses at once from one address: at most the free three (and one that got past
    a finished delay) reach the password check; the rest are refused unchecked."""
    async with running_console(stack) as console, console.client() as attacker:
        token = await csrf_of(attacker, "/login")

        async def guess(i: int) -> int:
            data = {"csrf": token, "name": "alice", "password": f"burst-{i}"}
            return (await attacker.post("/login", data=data)).status_code

        statuses = await asyncio.gather(*(guess(i) for i in range(20)))
    assert statuses.count(401) <= 4, statuses
    assert statuses.count(429) >= 16, statuses
    assert set(statuses) == {401, 429}
    logins = await _logins(stack)
    assert len(logins) == 20  # every attempt audited, refused ones too


async def test_logging_out_ends_the_session_at_once(stack: Stack) -> None:
    """The cookie from before the logout is refused: a redirect for a page, 401 for a POST."""
    async with running_console(stack) as console, console.client() as alice:
        await log_in(alice, "alice")
        kept = alice.cookies[SESSION]
        token = await csrf_of(alice, "/dead-letters")
        assert (await alice.post("/logout", data={"csrf": token})).status_code == 303
        async with console.client() as replay:
            replay.cookies.set(SESSION, kept)
            page = await replay.get("/dead-letters")
            assert (page.status_code, page.headers["location"]) == (303, "/login")
            posted = await replay.post("/act", data={"csrf": token, "action": "note"})
            assert posted.status_code == 401
    async with pg_connection(stack.database_url) as conn:
        row = await conn.fetchrow("SELECT ended_by, end_reason FROM console_sessions")
    assert row is not None
    assert dict(row) == {"ended_by": "alice", "end_reason": "logged out"}


async def test_sessions_end_from_the_command_line_and_the_page_and_at_their_timeouts(
    stack: Stack,
) -> None:
    """``end-sessions eve --operator alice`` ends eve's sessions (eve is refused after),
    and nobody else's; eve may not end sessions; alice ends bob's from the page; a session
    idle too long, or older than the absolute limit, is refused (the clock moved in the
    database, not waited for)."""
    async with (
        running_console(stack) as console,
        console.client() as alice,
        console.client() as eve,
        console.client() as bob,
    ):
        for client, name in ((alice, "alice"), (eve, "eve"), (bob, "bob")):
            await log_in(client, name)
        listed = await asyncio.to_thread(
            run_module, "service.console", "sessions", "--json", env=stack.env()
        )
        assert listed.returncode == 0, listed.stderr
        assert '"operator": "eve"' in listed.stdout
        assert "token" not in listed.stdout
        refused = await asyncio.to_thread(
            run_module, "service.console", "end-sessions", "alice", "--operator", "eve",
            env=stack.env(EXPIRY_REPLAY_OPERATORS="alice,bob"),
        )  # fmt: skip
        assert refused.returncode != 0
        assert "'eve' may not end sessions" in refused.stderr
        ended = await asyncio.to_thread(
            run_module, "service.console", "end-sessions", "eve", "--operator", "alice",
            env=stack.env(EXPIRY_REPLAY_OPERATORS="alice,bob"),
        )  # fmt: skip
        assert ended.returncode == 0, ended.stderr
        assert ended.stdout.splitlines()[-1] == "1 session(s) ended"
        assert (await eve.get("/")).status_code == 303
        assert (await alice.get("/")).status_code == 200

        assert (await eve.get("/sessions")).status_code == 303  # eve's session is gone
        await log_in(eve, "eve")
        assert (await eve.get("/sessions")).status_code == 403
        token = await csrf_of(alice, "/sessions")
        ended_page = await alice.post("/sessions/end", data={"csrf": token, "operator": "bob"})
        assert "1 session(s) ended" in ended_page.text
        assert (await bob.get("/")).status_code == 303

        async with pg_connection(stack.database_url) as conn:
            await conn.execute(
                "UPDATE console_sessions SET last_seen_at = now() - interval '31 minutes'"
                " WHERE operator = 'eve' AND ended_at IS NULL"
            )
            assert (await eve.get("/")).status_code == 303  # idle past 30 minutes
            await conn.execute(
                "UPDATE console_sessions SET started_at = now() - interval '8 hours 1 minute'"
                " WHERE operator = 'alice' AND ended_at IS NULL"
            )
            assert (await alice.get("/")).status_code == 303  # older than 8 hours
            reasons = await conn.fetch(
                "SELECT operator, ended_by, end_reason FROM console_sessions"
                " WHERE ended_at IS NOT NULL ORDER BY id"
            )
    assert [(r["operator"], r["ended_by"]) for r in reasons] == [("eve", "alice"), ("bob", "alice")]


async def test_a_password_change_ends_that_operators_sessions(stack: Stack) -> None:
    """alice's session, begun under her old password, is refused once the console runs with
    her new hash; bob's goes on."""
    async with running_console(stack) as first, first.client() as alice, first.client() as bob:
        await log_in(alice, "alice")
        await log_in(bob, "bob")
        kept = {"alice": alice.cookies[SESSION], "bob": bob.cookies[SESSION]}
    changed = users().replace(
        users().split(",")[0], f"alice:{hash_password('a-brand-new-password-1')}"
    )
    async with (
        running_console(stack, EXPIRY_CONSOLE_USERS=changed) as second,
        second.client() as alice,
        second.client() as bob,
    ):
        alice.cookies.set(SESSION, kept["alice"])
        bob.cookies.set(SESSION, kept["bob"])
        assert (await alice.get("/")).status_code == 303
        assert (await bob.get("/")).status_code == 200
    async with pg_connection(stack.database_url) as conn:
        reason = await conn.fetchval(
            "SELECT end_reason FROM console_sessions WHERE operator = 'alice'"
        )
    assert reason == "password changed"


async def test_a_login_form_from_elsewhere_is_refused(stack: Stack) -> None:
    """A login POST without this browser's login cookie (a cross-site form) is 403."""
    async with running_console(stack) as console, console.client() as victim:
        token = await csrf_of(victim, "/login")
        async with console.client() as other:
            forged = await other.post(
                "/login", data={"csrf": token, "name": "alice", "password": PASSWORDS["alice"]}
            )
        assert forged.status_code == 403
        assert SESSION not in forged.cookies


BAD_TARGETS = (
    "/dead-letters/%00",
    "/dead-letters?error_class=%00",
    "/dead-letters?give_up=a%00b",
    "/dead-letters/%C3%28",
    "/dead-letters?error_class=%FF",
    "/dead-letters?error_class=" + "x" * 5000,
    "/dead-letters?status=dead%0D%0ASet-Cookie:x=y",
)


async def test_input_the_database_would_refuse_is_answered_400_with_the_headers(
    stack: Stack,
) -> None:
    """NUL, invalid UTF-8, control characters and over-long values, in the path, the query
    or a form, logged in or not: 400, a plain page, the security headers; nothing reached
    the database (no 500, no audit row); 404, 405, 413 and 415 carry the headers too."""
    async with running_console(stack) as console, console.client() as alice:
        await log_in(alice, "alice")
        for target in BAD_TARGETS:
            answer = await alice.get(target)
            assert answer.status_code == 400, (target, answer.status_code, answer.text[:200])
            assert _has_security_headers(answer), target
            assert "Traceback" not in answer.text
            assert "asyncpg" not in answer.text
        token = await csrf_of(alice, "/dead-letters")
        nul = await alice.post("/act", data={"csrf": token, "action": "note", "key": "1\x00"})
        assert nul.status_code == 400
        assert _has_security_headers(nul)
        async with console.client() as anonymous:
            login_token = await csrf_of(anonymous, "/login")
            name = await anonymous.post(
                "/login", data={"csrf": login_token, "name": "al\x00ice", "password": "x"}
            )
            assert name.status_code == 400
            assert _has_security_headers(name)
            for answer, status in (
                (await anonymous.get("/no-such-page"), 404),
                (await anonymous.put("/login", content=b""), 405),
                (await anonymous.post("/login", content=b"x" * 70_000), 413),
                (
                    await anonymous.post(
                        "/login", content=b"{}", headers={"content-type": "application/json"}
                    ),
                    415,
                ),
            ):
                assert answer.status_code == status, (status, answer.text[:200])
                assert _has_security_headers(answer), status
    assert await _logins(stack) == [("alice", "ok")]


async def test_a_database_error_is_a_plain_page_with_the_headers(stack: Stack) -> None:
    """The table a page reads dropped under a running console: 503, a plain page, no
    internals, the security headers."""
    async with running_console(stack) as console, console.client() as alice:
        await log_in(alice, "alice")
        async with pg_connection(stack.database_url) as conn:
            await conn.execute("DROP TABLE console_sessions CASCADE")
        answer = await alice.get("/dead-letters")
        assert answer.status_code == 503
        assert "not migrated" in answer.text
        assert "UndefinedTable" not in answer.text
        assert "console_sessions" not in answer.text
        assert _has_security_headers(answer)


async def _raw_answer(port: int, head: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout=10)
    finally:
        writer.close()


async def test_an_over_long_request_line_or_header_block_is_answered_414_or_431(
    stack: Stack,
) -> None:
    """A 1 MB request line gets 414, 200 KB of headers 431, each a whole answer with the
    security headers, not a reset."""
    async with running_console(stack) as console:
        line = await _raw_answer(console.port, b"GET /" + b"a" * 1_000_000 + b" HTTP/1.1\r\n")
        headers = b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 100) for i in range(2000))
        block = await _raw_answer(
            console.port, b"GET / HTTP/1.1\r\nhost: x\r\n" + headers + b"\r\n"
        )
    assert line.startswith(b"HTTP/1.1 414 "), line[:100]
    assert block.startswith(b"HTTP/1.1 431 "), block[:100]
    for answer in (line, block):
        assert b"x-frame-options: DENY" in answer.lower().replace(b"deny", b"DENY")


async def test_an_unexpected_error_is_a_plain_500_with_the_headers(stack: Stack) -> None:
    """The real application, served by uvicorn with the console's protocol, with one more
    route that fails: a plain 500 page, the headers, nothing of the exception."""

    async def fails(_request: Request) -> Response:
        raise RuntimeError("secret internals: /etc/passwd")

    app = create_app(stack.settings)
    app.router.routes.append(Route("/fails", fails))
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            log_config=None,
            http=protocol.http_protocol(),
            h11_max_incomplete_event_size=protocol.HEADER_LIMIT,
        )
    )
    serving = asyncio.create_task(server.serve())
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            for _ in range(100):
                if server.started:
                    break
                await asyncio.sleep(0.05)
            answer = await client.get("/fails")
    finally:
        server.should_exit = True
        await serving
    assert answer.status_code == 500
    assert _has_security_headers(answer)
    assert "secret internals" not in answer.text
    assert "RuntimeError" not in answer.text
    assert "the console could not answer: the log says why" in answer.text


async def test_a_flood_of_refused_logins_does_not_hide_the_failures(stack: Stack) -> None:
    """10,000 refused attempts (free for an attacker) after nine failures: the throttle
    still weighs the nine, and reads them through its indexes."""
    async with pg_connection(stack.database_url) as conn:
        await conn.execute(
            "INSERT INTO console_logins (name, known, client_host, device, outcome)"
            " SELECT 'alice', true, '10.0.0.1', false, 'failed' FROM generate_series(1, 9)"
        )
        await conn.execute(
            "INSERT INTO console_logins (name, known, client_host, device, outcome)"
            " SELECT 'alice', true, '10.0.0.1', false, 'refused'"
            " FROM generate_series(1, 10000)"
        )
        await conn.execute("ANALYZE console_logins")
        holding = await conn.fetchval("SELECT tableoid::regclass::text FROM console_logins LIMIT 1")
        _now, weighed = await console_store.recent_logins(conn, "alice", "10.0.0.1", 900)
        plan = "\n".join(
            row[0]
            for row in await conn.fetch(
                "EXPLAIN " + console_store.RECENT_LOGINS, "alice", "10.0.0.1", 900.0
            )
        )
    assert [attempt.outcome for attempt in weighed] == ["failed"] * 9
    # The week's partition that holds them is read through its copy of a checked_by index
    # (on (name, at) or (client_host, at), refused attempts left out); the other weeks'
    # partitions are empty.
    assert re.search(rf"Index Scan using {holding}_(name|client_host)_at_idx", plan), plan
    assert f"Seq Scan on {holding}" not in plan, plan
