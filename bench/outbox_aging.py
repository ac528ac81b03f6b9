"""``python -m bench.outbox_aging``: does the outbox stay fast as it ages? One relay drains a
million events, a round of 100,000 at a time, and its rate, the outbox's size and its
dead tuples are printed after every round.

In a database and a vhost of its own (``bench_<random>``, migrated and declared as a
deploy does, removed at the end), with a quorum queue of its own bound to
``expiry.events`` (purged after each round), one ``python -m service.relay`` with the
shipped settings runs throughout. Each round writes ``--round`` events straight into
``expiry_events`` as the owner (one statement, as the trigger of a batch writes them;
no expiry behind them: the relay does not look), wakes the relay (``NOTIFY``) and waits
until the outbox is empty again. A sent event leaves the outbox (deleted, and recorded
in ``expiry_events_sent``), so every round leaves ``--round`` dead tuples behind it
until autovacuum (after every 1,000 changes, at its next look: ``autovacuum_naptime``)
clears them.

Per round: the relay's rate from its marks (every batch but the first over the time
from the first mark to the last), its mean batch time (``expiry_relay_batch_duration_seconds``
on its ``/metrics``) and its CPU per event; the outbox's dead tuples: the most that
``pg_stat_user_tables`` showed while it drained (sampled every second: what autovacuum
sees, as the server has flushed it) and, once empty, the exact count (``pgstattuple``,
created in the sandbox); its size on disk (heap and indexes), autovacuum's runs so far
(the statistics), and the record's size. Figures,
not a test: it exits 0 after a complete run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path

import aio_pika
import asyncpg

from bench import outbox
from bench.amqp import EVENTS_QUEUE, Probe
from bench.config import Options, endpoints_from
from bench.db import Connection
from bench.procs import Child, Processes, tree_usage
from bench.recording import free_port
from bench.sandbox import deployed, new_name
from bench.scrape import BATCH_DURATION, Histogram, histogram, scrape
from bench.supervisor import Supervisor
from service.cli import positive

POLL_SECONDS = 0.25
SAMPLE_SECONDS = 1.0
STATS_FLUSH_SECONDS = 1.5  # the server publishes a backend's statistics within a second
MB = 1024 * 1024


def say(text: str = "") -> None:
    """One line of the report, on stdout."""
    print(text, flush=True)


@dataclass(frozen=True)
class Round:
    """What one round of events measured."""

    number: int
    events: int  # sent in the round
    seconds: float  # from the relay's first mark to its last
    rate: float
    batch_ms: float  # the relay's mean batch (claim, publish with confirms, mark)
    cpu_us: float  # the relay's CPU per event
    dead_peak: int  # the outbox's dead tuples at their highest while it drained (statistics)
    dead_exact: int  # once it was empty, read from the table (pgstattuple); -1: unknown
    after: outbox.TableFigures  # once it was empty (the statistics as flushed by then)


class Vacuumer:
    """Where the server's autovacuum is off: ``VACUUM expiry_events`` every ``every``
    seconds when the statistics show at least ``THRESHOLD`` dead tuples, as autovacuum
    does with the outbox's thresholds at each look (``autovacuum_naptime``)."""

    THRESHOLD = 1000  # autovacuum_vacuum_threshold of expiry_events (migration 0014)

    def __init__(self, conn: Connection, every: float) -> None:
        self.conn = conn
        self.every = every

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every)
            if (await outbox.table_figures(self.conn)).dead >= self.THRESHOLD:
                await self.conn.execute("VACUUM expiry_events")


@contextlib.asynccontextmanager
async def vacuuming(url: str, every: float | None) -> AsyncIterator[None]:
    """A ``Vacuumer`` on a connection of its own for the block (none if ``every`` is None)."""
    if every is None:
        yield
        return
    conn: Connection = await asyncpg.connect(url)
    task = asyncio.create_task(Vacuumer(conn, every).run())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await conn.close()


def parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(prog="python -m bench.outbox_aging", description=__doc__)
    add = p.add_argument
    add("--events", type=positive(int), default=1_000_000, help="events in all (1,000,000)")
    add("--round", type=positive(int), default=100_000, help="events per round (100,000)")
    add(
        "--vacuum-every",
        type=positive(float),
        metavar="SECONDS",
        help="where the server's autovacuum is off, VACUUM the outbox this often, as "
        "autovacuum would (default: the server's autovacuum_naptime)",
    )
    add("--no-vacuum", action="store_true", help="never VACUUM by hand (autovacuum's alone)")
    add("--json", type=Path, metavar="FILE", help="write the figures to FILE")
    add("--keep-logs", action="store_true", help="keep the relay's log")
    return p


class Sampler:
    """The outbox's figures every second while a round drains: the highest dead tuples."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.dead_peak = 0

    async def run(self) -> None:
        while True:
            figures = await outbox.table_figures(self.conn)
            self.dead_peak = max(self.dead_peak, figures.dead)
            await asyncio.sleep(SAMPLE_SECONDS)


@contextlib.asynccontextmanager
async def sampling(url: str) -> AsyncIterator[Sampler]:
    """A ``Sampler`` on a connection of its own for the block."""
    conn: Connection = await asyncpg.connect(url)
    sampler = Sampler(conn)
    task = asyncio.create_task(sampler.run())
    try:
        yield sampler
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await conn.close()


async def drained(conn: Connection, relay: Child, procs: Processes) -> None:
    """Until the outbox is empty (the relay still running)."""
    while await outbox.pending(conn):
        procs.check_alive([relay])
        await asyncio.sleep(POLL_SECONDS)


@dataclass
class Aging:
    """One run: the sandbox's connection, its relay and its metrics port."""

    conn: Connection
    database_url: str
    probe: Probe
    procs: Processes
    relay: Child
    port: int
    batches: Histogram

    async def round(self, number: int, events: int) -> Round:
        """Write ``events`` events, wake the relay, wait until it has sent them."""
        conn = self.conn
        since = await outbox.now(conn)
        async with sampling(self.database_url) as sampler:
            await outbox.insert_events(conn, events)
            cpu = tree_usage(self.relay.pid).cpu_seconds
            await conn.execute("NOTIFY expiry_events")
            await drained(conn, self.relay, self.procs)
            cpu = tree_usage(self.relay.pid).cpu_seconds - cpu
        marks = await outbox.relay_rate(conn, since, await outbox.now(conn))
        batches = histogram(await scrape(self.port), BATCH_DURATION)
        spent, self.batches = batches.minus(self.batches), batches
        await self.probe.purge(EVENTS_QUEUE)
        exact = await outbox.exact_tuples(conn)
        await asyncio.sleep(STATS_FLUSH_SECONDS)
        return Round(
            number,
            marks.events,
            marks.seconds,
            marks.rate,
            spent.sum / spent.count * 1000 if spent.count else 0.0,
            cpu / marks.events * 1e6 if marks.events else 0.0,
            sampler.dead_peak,
            exact[1] if exact is not None else -1,
            await outbox.table_figures(conn),
        )


HEADER = (
    f"  {'round':>5} {'events':>9} {'seconds':>8} {'events/s':>9} {'batch ms':>9} "
    f"{'us/event':>9} {'dead seen':>10} {'dead after':>10} {'heap MB':>8} {'index MB':>8} "
    f"{'vacuums':>11} {'sent MB':>8}"
)


def line(r: Round) -> str:
    """One round's row of the table."""
    a = r.after
    return (
        f"  {r.number:>5} {r.events:>9,} {r.seconds:>8.1f} {r.rate:>9,.0f} {r.batch_ms:>9.1f} "
        f"{r.cpu_us:>9.0f} {r.dead_peak:>10,} {r.dead_exact:>10,} {a.heap_bytes / MB:>8.1f} "
        f"{(a.bytes - a.heap_bytes) / MB:>8.1f} {a.autovacuums + a.vacuums:>11} "
        f"{a.sent_bytes / MB:>8.1f}"
    )


def summary(rounds: list[Round], per_round: int) -> list[str]:
    """The first and the last round side by side."""
    first, last = rounds[0], rounds[-1]
    ratio = last.rate / first.rate if first.rate else 0.0
    sent = sum(r.events for r in rounds)
    return [
        f"  first {per_round:,}: {first.rate:,.0f}/s; last {per_round:,} (after "
        f"{sent - last.events:,} sent): {last.rate:,.0f}/s, {ratio:.0%} of the first",
        f"  slowest round {min(r.rate for r in rounds):,.0f}/s, fastest "
        f"{max(r.rate for r in rounds):,.0f}/s; dead tuples at most "
        f"{max(r.dead_exact for r in rounds):,} after a round; the outbox at most "
        f"{max(r.after.bytes for r in rounds) / MB:.1f} MB once drained "
        f"(heap {last.after.heap_bytes / MB:.1f} MB at the end)",
    ]


async def vacuum_every(conn: Connection, args: argparse.Namespace) -> float | None:
    """None where autovacuum is on; else how often to VACUUM by hand (0: never)."""
    if await conn.fetchval("SHOW autovacuum") == "on":
        return None
    if args.no_vacuum:
        return 0.0
    if args.vacuum_every is not None:
        return float(args.vacuum_every)
    seconds: float = await conn.fetchval(
        "SELECT setting::float8 FROM pg_settings WHERE name = 'autovacuum_naptime'"
    )
    return seconds


async def run(args: argparse.Namespace, logs: Path) -> list[Round]:
    """The sandbox, the relay, the rounds."""
    endpoints = endpoints_from(os.environ)
    name = new_name()
    async with deployed(endpoints, name, logs, say) as (sandbox, procs):
        conn: Connection = await asyncpg.connect(sandbox.database_url)
        connection = await aio_pika.connect(sandbox.amqp_url)
        try:
            probe = Probe(connection)
            await probe.bind_events()
            options = Options(args.round, 1, (1,), 1, 0.0, 0, 1.0, False, None)
            supervisor = Supervisor(procs, probe, conn, options)
            port = free_port()
            every = await vacuum_every(conn, args)
            say(
                f"python -m bench.outbox_aging: {args.events:,} events, {args.round:,} a round, "
                f"through one relay (shipped settings); database and vhost {name}; "
                + (
                    "autovacuum on (the server's)"
                    if every is None
                    else f"autovacuum off on this server: VACUUM expiry_events every {every:g} s "
                    "when it has 1,000 dead tuples or more (as autovacuum would)"
                    if every
                    else "autovacuum off on this server, and no VACUUM (--no-vacuum)"
                )
            )
            relay = await supervisor.relay({"EXPIRY_HTTP_PORT": str(port)})
            aging = Aging(conn, sandbox.database_url, probe, procs, relay, port, histogram("", ""))
            rounds: list[Round] = []
            say(HEADER)
            async with vacuuming(sandbox.database_url, every or None):
                for number in range(1, -(-args.events // args.round) + 1):
                    count = min(args.round, args.events - (number - 1) * args.round)
                    rounds.append(await aging.round(number, count))
                    say(line(rounds[-1]))
            await supervisor.stop([relay])
        finally:
            await connection.close()
            await conn.close()
    return rounds


def main() -> None:
    """Entry point: exit 0 after a complete run."""
    args = parser().parse_args()
    logs = Path(tempfile.mkdtemp(prefix="outbox-aging-logs-"))
    began = time.perf_counter()
    try:
        rounds = asyncio.run(run(args, logs))
    except BaseException:
        say(f"the relay's log is kept in {logs}")
        raise
    for text in summary(rounds, args.round):
        say(text)
    say(f"elapsed {time.perf_counter() - began:.0f} s")
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in rounds], indent=2) + "\n")
    if args.keep_logs:
        say(f"the relay's log is kept in {logs}")
    else:
        shutil.rmtree(logs, ignore_errors=True)


if __name__ == "__main__":
    main()
