"""The console's overview tells what ``status`` tells: the same verdict and problem lines
(one piece of code decides them), on a database not migrated too, and scan passes with
their age for people, the stale and the failed ones marked."""

from __future__ import annotations

import asyncio
import html
import re

import pytest

from service.adapters import postgres
from service.adapters.postgres import webhook_endpoints
from tests.acceptance.console_support import PASSWORDS, csrf_of, log_in, running_console
from tests.outbox_rows import mark_all_sent
from tests.support import Stack, insert_holds, pg_connection, run_module

pytestmark = pytest.mark.acceptance

VERDICT = re.compile(r'<strong id="verdict-line">([^<]*)</strong>')
PROBLEM = re.compile(r'<li class="problem" data-condition="([^"]+)">')
SCAN_ROW = re.compile(r'<tr class="scan">(.*?)</tr>', re.DOTALL)


async def _overview(stack: Stack) -> str:
    async with running_console(stack) as console, console.client() as alice:
        await log_in(alice, "alice")
        answer = await alice.get("/")
    assert answer.status_code == 200, answer.text
    return answer.text


async def _status_verdict(stack: Stack) -> str:
    result = await asyncio.to_thread(run_module, "service.status", env=stack.env())
    return result.stdout.splitlines()[0]


# An age in a verdict ("17h 35m", "10m 3s", "1.5s"): the page and the command read the
# clock moments apart, and a minute may turn between them on a loaded machine.
AGE = re.compile(r"\b\d+(\.\d+)?[dhms]( \d+(\.\d+)?[dhms])*\b")


def _without_ages(verdict: str) -> str:
    return AGE.sub("<age>", verdict)


def _verdict(page: str) -> str:
    found = VERDICT.search(page)
    assert found is not None, page
    return html.unescape(found.group(1))


async def test_a_database_not_migrated_is_said_at_the_login(stack: Stack) -> None:
    """No 500: the console keeps its sessions in the database, so the login answers 503
    with what to run, as status says it (a plain page with no internals)."""
    async with pg_connection(stack.database_url) as conn:
        await conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    async with running_console(stack) as console, console.client() as alice:
        token = await csrf_of(alice, "/login")
        answer = await alice.post(
            "/login", data={"csrf": token, "name": "alice", "password": PASSWORDS["alice"]}
        )
    assert answer.status_code == 503
    assert "the database is not migrated: run python -m service.migrate" in answer.text
    assert "relation" not in answer.text
    assert (await _status_verdict(stack)).startswith("NOT SET UP: the database is not migrated")


async def test_the_overview_marks_stale_and_failed_passes_and_shows_ages_for_people(
    stack: Stack,
) -> None:
    """An hour-old pass is stale (the scanner looks stopped), an older failed one of a gone
    process is stale and failed; ages read 1h ago, not seconds; same verdict as status."""
    async with pg_connection(stack.database_url) as conn:
        await conn.execute(
            "INSERT INTO scan_passes (scanner, started_at, finished_at, result, published, "
            "unconfirmed) VALUES "
            "('host:101', now() - interval '61 minutes', now() - interval '1 hour', 'ok', 5, 0),"
            "('host:100', now() - interval '3 hours', now() - interval '3 hours', "
            "'unconfirmed', 0, 3)"
        )
    page = await _overview(stack)
    verdict = _verdict(page)
    assert verdict.startswith("DEGRADED: no consumer is attached to expirations")
    assert _without_ages(verdict) == _without_ages(await _status_verdict(stack))
    assert PROBLEM.findall(page) == ["no-consumer", "scanner-stopped"]
    assert "the scanner looks stopped: no pass has ended for 1h" in page
    rows = SCAN_ROW.findall(page)
    assert len(rows) == 2
    recent, old = rows
    assert '<td class="bad">1h ago (stale)</td>' in recent
    assert '<td class="ok">ok</td>' in recent
    assert '<td class="bad">3h ago (stale)</td>' in old
    assert '<td class="bad">unconfirmed</td>' in old
    assert '<span id="open-dead">0</span>' in page
    assert "expirations.retry.* (2 delay queues)" in page
    assert not re.search(r"\d{4,}\.\d s", page)  # no raw seconds


async def test_what_is_kept_shows_and_a_stopped_retention_is_flagged_until_it_runs(
    stack: Stack,
) -> None:
    """Retention began two days ago and never ran, and the audit's partitions reach only
    the end of this week: status and the overview say ALERT (partitions running out) and
    retention not run, show each table's size and range; one run clears both."""
    async with pg_connection(stack.database_url) as conn:
        await conn.execute(
            "UPDATE schema_migrations SET applied_at = now() - interval '2 days'"
            " WHERE version = '0013_retention'"
        )
        later = await conn.fetch(
            "SELECT p.relname AS parent, c.relname AS name FROM pg_inherits i"
            " JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent"
            " WHERE expiry_partition_low(c.oid) > now()"
        )
        for row in later:
            await conn.execute(f'ALTER TABLE "{row["parent"]}" DETACH PARTITION "{row["name"]}"')
            await conn.execute(f'DROP TABLE "{row["name"]}"')
    page = await _overview(stack)
    verdict = _verdict(page)
    assert verdict.startswith("ALERT: the audit tables' partitions reach only")
    assert _without_ages(verdict) == _without_ages(await _status_verdict(stack))
    assert PROBLEM.findall(page)[:1] == ["partitions-running-out"]
    assert "retention-not-run" in PROBLEM.findall(page)
    assert "retention has not succeeded for 2d" in page
    assert '<strong id="retention-last">never run</strong>' in page
    assert re.search(r'<tr class="table"><td>reservation_transitions</td><td>\d+</td>', page)

    ran = await asyncio.to_thread(run_module, "service.retention", env=stack.env())
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines()[-1].startswith("retention done: ")
    page = await _overview(stack)
    assert not {"partitions-running-out", "retention-not-run"} & set(PROBLEM.findall(page))
    assert re.search(r'<strong id="retention-last">last run [\d.]+s ago</strong>', page)
    status = await asyncio.to_thread(run_module, "service.status", env=stack.env())
    assert re.search(r"retention \(last run [\d.]+s ago\)", status.stdout)
    assert re.search(
        r"\n  reservation_transitions +[\d.]+ [kM]?B +\d{4}-\d\d-\d\d \.\. ", status.stdout
    )


async def test_events_waiting_past_their_objective_show_as_status_says(stack: Stack) -> None:
    """Two expiries whose events have waited ten minutes (no relay runs): the overview says
    ALERT as status does (start the relay), and shows the outbox's backlog against the
    objective; once they are sent, the line is within it again."""
    ids = await insert_holds(stack.database_url, 2)
    async with pg_connection(stack.database_url) as conn:
        await postgres.expire_batch(conn, ids, ["m", "m"], [1, 1], worker="w")
        await conn.execute("UPDATE expiry_events SET created_at = now() - interval '10 minutes'")
    page = await _overview(stack)
    verdict = _verdict(page)
    assert verdict.startswith("ALERT: the oldest pending event is 10m ")
    assert _without_ages(verdict) == _without_ages(await _status_verdict(stack))
    assert "events-behind" in PROBLEM.findall(page)
    assert "start python -m service.relay, or check it" in html.unescape(page)
    assert '<strong id="events-pending">2</strong>' in page
    assert re.search(r'<strong id="events-oldest">10m( \d+s)?</strong> · objective 1m', page)
    assert 'class="bad">BEHIND</strong>' in page
    async with pg_connection(stack.database_url) as conn:
        await mark_all_sent(conn)
    page = await _overview(stack)
    assert "events-behind" not in PROBLEM.findall(page)
    assert '<strong id="events-pending">0</strong>' in page
    assert 'class="ok">within</strong>' in page


async def test_webhook_endpoints_show_as_status_says(stack: Stack) -> None:
    """A registered endpoint whose deliveries have waited ten minutes and that is paused:
    the overview says ALERT as status does, lists webhooks-behind and webhook-paused, and
    shows the endpoint's row (pending, the oldest, dead, its pause)."""
    async with pg_connection(stack.database_url) as conn:
        await webhook_endpoints.register(conn, ["orders"])
        ids = await insert_holds(stack.database_url, 2)
        await postgres.expire_batch(conn, ids, ["m", "m"], [1, 1], worker="w")
        await conn.execute(
            "UPDATE webhook_deliveries SET created_at = now() - interval '10 minutes',"
            " since = now() - interval '10 minutes'"
        )
        await conn.execute(
            "UPDATE webhook_endpoints SET paused_until = now() + interval '5 minutes'"
        )
        await mark_all_sent(conn)  # the events themselves were published
    page = await _overview(stack)
    verdict = _verdict(page)
    assert verdict.startswith("ALERT: webhook endpoint orders: the oldest pending delivery is 10m")
    assert _without_ages(verdict) == _without_ages(await _status_verdict(stack))
    assert {"webhooks-behind", "webhook-paused"} <= set(PROBLEM.findall(page))
    row = re.search(r'<table id="webhooks">(.*?)</table>', page, re.DOTALL)
    assert row is not None, page
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", row.group(1))
    assert cells[:2] == ["orders", "2"]
    assert re.fullmatch(r"10m( \d+s)?", cells[2]), cells
    assert cells[3] == "0"
    assert re.fullmatch(r"paused [45]m \d+s|paused 5m", cells[4]), cells
