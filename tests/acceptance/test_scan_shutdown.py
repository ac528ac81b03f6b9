"""SIGTERM stops ``python -m service.produce`` within seconds, whatever its backlog."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import pytest

from service import produce
from tests.acceptance.processes import output_so_far, run, start, stop
from tests.proxy import tcp_proxy
from tests.support import Stack, eventually, insert_holds, pg_connection, queue_depth

pytestmark = pytest.mark.acceptance

HOLDS = 15_000
STOP_WITHIN_SECONDS = 5.0
# Small pages: a pass over the backlog takes 150 of them, so the signal finds it mid-way
# (each test checks that it did: fewer than HOLDS commands queued when it stopped).
SMALL_PAGES = {"EXPIRY_SCAN_BATCH_SIZE": "100"}
MID_PASS = 2_000  # commands in the queue when the signal is sent
WITHHELD_TIMEOUT = 2.0  # EXPIRY_PUBLISH_TIMEOUT_SECONDS when the broker withholds confirms
STOPPED_LINE = re.compile(
    r"^python -m service\.produce: failed: ScanStopped: stopped by a signal before "
    r"finishing: (\d+) command\(s\) confirmed; the next scan publishes the rest$"
)
LEASES = """
SELECT count(*) FILTER (WHERE publish_count > 0) AS leased,
       count(*) FILTER (WHERE lease_until > now() AND publish_count = 0) AS live_claims
  FROM publish_leases
"""


async def _queued(stack: Stack) -> int:
    try:
        return await queue_depth(stack.amqp_url, "expirations")
    except aio_pika.exceptions.ChannelNotFoundEntity:  # not declared yet
        return 0


async def _publishing(stack: Stack, scanner: asyncio.subprocess.Process) -> bool:
    assert scanner.returncode is None, "the scan ended before it was signalled"
    return await _queued(stack) >= MID_PASS


async def _terminate(scanner: asyncio.subprocess.Process, what: str) -> tuple[int, str, float]:
    """SIGTERM the scanner; return its exit code, its output and how long it took to exit."""
    scanner.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    try:
        async with asyncio.timeout(60):
            await scanner.wait()
    except TimeoutError:
        scanner.kill()  # leave no scanner behind a failed test
        raise
    elapsed = time.monotonic() - signalled
    code, output = await stop(scanner)
    print(f"{what}: exit {code}, {elapsed:.2f}s after SIGTERM")
    return code, output, elapsed


async def _terminate_mid_pass(stack: Stack, *args: str) -> tuple[int, str, float]:
    """Start the scan over the backlog; SIGTERM it once MID_PASS commands are queued."""
    scanner = await start("service.produce", *args, env=stack.env(**SMALL_PAGES))
    await eventually(lambda: _publishing(stack, scanner), timeout=60, every=0.05)
    return await _terminate(scanner, " ".join(args))


async def _consistent_and_cut_short(stack: Stack) -> int:
    """Every queued command has its recorded lease, no claim is left live without a
    publish, and the pass did not publish everything; return the queue's depth."""
    depth = await queue_depth(stack.amqp_url, "expirations")
    async with pg_connection(stack.database_url) as conn:
        row = await conn.fetchrow(LEASES)
    assert row is not None
    print(f"cut short: {depth} of {HOLDS} commands published")
    assert MID_PASS <= depth < HOLDS
    assert (row["leased"], row["live_claims"]) == (depth, 0)
    return depth


async def _a_full_scan_publishes_the_rest(stack: Stack) -> None:
    """A --scan to completion leaves one command per due hold, none published twice."""
    result = await asyncio.to_thread(run, "service.produce", "--scan", env=stack.env(), timeout=120)
    assert result.returncode == 0, result.stderr
    assert await queue_depth(stack.amqp_url, "expirations") == HOLDS
    async with pg_connection(stack.database_url) as conn:
        rows = await conn.fetch(
            "SELECT publish_count, count(*) AS n FROM publish_leases GROUP BY 1"
        )
    assert {row["publish_count"]: row["n"] for row in rows} == {1: HOLDS}


def _not_publish_failed(output: str) -> list[str]:
    return [line for line in output.splitlines() if "expiry.publish_failed" not in line]


def _events(output: str, name: str) -> list[dict[str, Any]]:
    lines = (json.loads(line) for line in output.splitlines() if line.startswith("{"))
    return [entry for entry in lines if entry["event"] == name]


async def test_every_stops_mid_pass_on_sigterm_and_exits_zero(stack: Stack) -> None:
    """SIGTERM mid-pass: --every exits 0 within seconds, every queued command leased."""
    await insert_holds(stack.database_url, HOLDS)
    code, output, elapsed = await _terminate_mid_pass(stack, "--every", "1")
    assert code == 0, output
    assert elapsed < STOP_WITHIN_SECONDS
    depth = await _consistent_and_cut_short(stack)
    [stopped] = _events(output, "scan.stopped")
    assert (stopped["published"], stopped["failed"]) == (depth, 0)
    assert "Traceback" not in output
    await _a_full_scan_publishes_the_rest(stack)


async def test_scan_stops_mid_pass_on_sigterm_and_exits_non_zero(stack: Stack) -> None:
    """SIGTERM mid-pass: --scan exits 1 within seconds with one line saying it was stopped."""
    await insert_holds(stack.database_url, HOLDS)
    code, output, elapsed = await _terminate_mid_pass(stack, "--scan")
    assert code == 1, output
    assert elapsed < STOP_WITHIN_SECONDS
    depth = await _consistent_and_cut_short(stack)
    stopped = [line for line in output.splitlines() if "stopped" in line]
    assert len(stopped) == 1, output
    match = STOPPED_LINE.match(stopped[0])
    assert match is not None, stopped[0]
    assert int(match.group(1)) == depth
    assert "Traceback" not in output
    await _a_full_scan_publishes_the_rest(stack)


def _at_port(url: str, port: int) -> str:
    parts = urlsplit(url)
    userinfo = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return urlunsplit(parts._replace(netloc=f"{userinfo}127.0.0.1:{port}"))


@pytest.mark.parametrize("broker", ["closed-port", "silent"])
async def test_every_exits_on_sigterm_while_the_broker_is_unreachable(
    stack: Stack, broker: str
) -> None:
    """SIGTERM while --every cannot reach the broker (refused, or silent): exit 0 in seconds."""
    await insert_holds(stack.database_url, 10)
    async with tcp_proxy(stack.amqp_url, 5672) as proxy:
        proxy.blackhole()  # accepts connections, answers nothing
        url = proxy.url(stack.amqp_url) if broker == "silent" else _at_port(stack.amqp_url, 1)
        # A connect attempt is never cancelled (see service.scan.once._connect_broker): to a
        # silent broker it ends after the publish timeout, here 2 s.
        env = stack.env(AMQP_URL=url, EXPIRY_PUBLISH_TIMEOUT_SECONDS="2")
        scanner = await start("service.produce", "--every", "1", env=env)

        async def failed_once() -> bool:
            return '"event": "scan.failed"' in output_so_far(scanner)

        # A pass has failed (however slowly the process started); then it is connecting
        # again (silent) or between failed passes (refused).
        await eventually(failed_once, timeout=60, every=0.1)
        await asyncio.sleep(0.5)
        code, output, elapsed = await _terminate(scanner, f"--every, broker {broker}")
    assert code == 0, output
    assert elapsed < STOP_WITHIN_SECONDS
    assert _events(output, "scan.failed"), output
    assert "Traceback" not in output
    async with pg_connection(stack.database_url) as conn:
        assert await conn.fetchval("SELECT count(*) FROM publish_leases") == 0


async def test_every_waits_for_withheld_confirms_no_longer_than_the_publish_timeout(
    stack: Stack,
) -> None:
    """SIGTERM while the broker withholds confirms: --every gives up on them after the
    publish timeout, releases their claims, records the confirmed and exits 0."""
    await insert_holds(stack.database_url, HOLDS)
    async with tcp_proxy(stack.amqp_url, 5672) as proxy:
        env = stack.env(
            AMQP_URL=proxy.url(stack.amqp_url),
            EXPIRY_PUBLISH_TIMEOUT_SECONDS=str(WITHHELD_TIMEOUT),
            **SMALL_PAGES,
        )
        scanner = await start("service.produce", "--every", "1", env=env)
        await eventually(lambda: _publishing(stack, scanner), timeout=60, every=0.05)
        proxy.blackhole()  # nothing more reaches the broker, no confirm comes back
        code, output, elapsed = await _terminate(scanner, "--every, confirms withheld")
    assert code == 0, output
    # The publish timeout, then closing a connection that no longer answers (~2 s).
    assert elapsed < WITHHELD_TIMEOUT + STOP_WITHIN_SECONDS
    stopped_lines = _events(output, "scan.stopped")  # stopped, not cancelled at the hard bound
    assert len(stopped_lines) == 1, "\n".join(_not_publish_failed(output))
    [stopped] = stopped_lines
    print(f"confirms withheld: {stopped['published']} confirmed, {stopped['failed']} released")
    async with pg_connection(stack.database_url) as conn:
        row = await conn.fetchrow(LEASES)
    assert row is not None
    assert (row["leased"], row["live_claims"]) == (stopped["published"], 0)
    assert row["leased"] < HOLDS, "the stop did not land mid-pass"
    assert row["leased"] <= await queue_depth(stack.amqp_url, "expirations")


@pytest.mark.parametrize("mode", ["--every", "--scan"])
async def test_a_stop_stuck_on_the_database_is_cancelled_at_the_hard_bound(
    stack: Stack, mode: str
) -> None:
    """A stop that cannot record (its table locked) is cancelled at the publish timeout
    plus the stop margin; its claims then lapse and a later scan publishes the rest."""
    await insert_holds(stack.database_url, HOLDS)
    env = stack.env(
        EXPIRY_PUBLISH_TIMEOUT_SECONDS=str(WITHHELD_TIMEOUT),
        EXPIRY_LOCK_TIMEOUT_MS="60000",
        EXPIRY_STATEMENT_TIMEOUT_MS="60000",
        **SMALL_PAGES,
    )
    scanner = await start("service.produce", mode, *(["1"] if mode == "--every" else []), env=env)
    await eventually(lambda: _publishing(stack, scanner), timeout=60, every=0.05)
    async with pg_connection(stack.database_url) as conn, conn.transaction():
        await conn.execute("LOCK TABLE publish_leases IN EXCLUSIVE MODE")
        code, output, elapsed = await _terminate(scanner, f"{mode}, recording blocked")
    bound = WITHHELD_TIMEOUT + produce.STOP_MARGIN_SECONDS
    assert bound <= elapsed < bound + 2.0
    if mode == "--every":
        assert code == 0, output
        assert _events(output, "scan.abandoned"), output
    else:
        assert code == 1, output
        last = output.strip().splitlines()[-1]
        assert last.startswith("python -m service.produce: failed: ScanStopped: stopped by a")
        assert f"cancelled after {bound:g}s" in last
    await eventually(lambda: _no_live_claims(stack), timeout=bound + 5)
    stopped_at = await queue_depth(stack.amqp_url, "expirations")
    assert MID_PASS <= stopped_at < HOLDS, f"the stop did not land mid-pass: {stopped_at} queued"
    result = await asyncio.to_thread(run, "service.produce", "--scan", env=stack.env(), timeout=120)
    assert result.returncode == 0, result.stderr
    # A command confirmed but not recorded before the cancel is published again.
    assert await queue_depth(stack.amqp_url, "expirations") >= HOLDS


async def _no_live_claims(stack: Stack) -> bool:
    async with pg_connection(stack.database_url) as conn:
        row = await conn.fetchrow(LEASES)
    return row is not None and row["live_claims"] == 0
