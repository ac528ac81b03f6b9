"""``python -m service.demo``: from nothing to watching holds expire, with one command.

Where PostgreSQL and RabbitMQ already run, the demo creates its own database
(``CREATE DATABASE`` on the server of ``DATABASE_URL``) and its own vhost
(through the management API beside ``AMQP_URL``, or ``RABBITMQ_MANAGEMENT_URL``),
so it never touches anyone's data. In them it runs the real commands:
``service.migrate``, then declares the topology as ``service.declare`` does (the
deploy's step), then several ``service.consume`` and ``service.produce --every``.
It places a few thousand holds due over the next few seconds, and a support
side consumes some of them right at their deadline, racing the service with the
same guarded update other systems use. It shows live progress, stops everything
with SIGTERM, prints a summary that checks that every hold ended in exactly one
state, and removes what it created (``--keep`` leaves it for inspection).
Exit 0 only if every check passed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import random
import re
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any
from urllib.error import HTTPError, URLError
from urllib.parse import quote, unquote, urlsplit, urlunsplit
from urllib.request import Request, urlopen
from uuid import UUID

import aio_pika
import aiormq.exceptions
import asyncpg
from aio_pika.abc import AbstractChannel, AbstractConnection
from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.adapters import postgres
from service.cli import run_command
from service.core.dsn import with_database
from service.core.topology import DEAD_QUEUE, QUEUE, retry_queue
from service.declare import declare
from service.settings import Settings, redact_url

DEFAULT_HOLDS = 3000
DEFAULT_CONSUMERS = 3
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
MANAGEMENT_PORT = 15672
STOP_TIMEOUT_SECONDS = 60.0

Connection = postgres.PlainConnection


# -- the plan and the sandbox --------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What this run does (from the command line)."""

    holds: int
    consumers: int
    lead: float  # seconds until the first deadline
    spread: float  # deadlines spread over this many seconds after that
    support_share: float  # share of holds the support side consumes at their deadline
    scan_every: float
    timeout: float  # after the last deadline, how long to wait for every hold to end
    keep: bool
    name: str


class DemoEnvironment(BaseSettings):
    """The one setting only the demo needs: where the RabbitMQ management API is."""

    model_config = SettingsConfigDict(env_file=".env", extra="ignore")

    management_url: str | None = Field(
        default=None, validation_alias=AliasChoices("RABBITMQ_MANAGEMENT_URL")
    )


def management_url_for(amqp_url: str) -> str:
    """The management API beside an AMQP node: same host and credentials, port 15672."""
    parts = urlsplit(amqp_url)
    user, password = parts.username or "guest", parts.password or "guest"
    return f"http://{user}:{password}@{parts.hostname}:{MANAGEMENT_PORT}"


class Management:
    """The management API calls the demo makes (standard library HTTP, run in a thread)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        port = parts.port or MANAGEMENT_PORT
        self.base = urlunsplit(parts._replace(netloc=f"{parts.hostname}:{port}", path="/api"))
        user, password = unquote(parts.username or "guest"), unquote(parts.password or "guest")
        self._auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    def _call(self, method: str, path: str, body: dict[str, str] | None = None) -> None:
        request = Request(f"{self.base}{path}", data=json.dumps(body or {}).encode(), method=method)
        request.add_header("content-type", "application/json")
        request.add_header("authorization", self._auth)
        try:
            with urlopen(request, timeout=30):
                pass
        except HTTPError as exc:
            raise ConnectionError(f"RabbitMQ management API: {method} {path}: {exc}") from None
        except URLError as exc:
            raise ConnectionError(
                f"cannot reach the RabbitMQ management API at {self.base} ({exc.reason}); "
                "set RABBITMQ_MANAGEMENT_URL"
            ) from None

    async def create_vhost(self, vhost: str, user: str) -> None:
        """Create ``vhost`` and let ``user`` do anything in it."""
        name = quote(vhost, safe="")
        await asyncio.to_thread(self._call, "PUT", f"/vhosts/{name}")
        everything = {"configure": ".*", "write": ".*", "read": ".*"}
        path = f"/permissions/{name}/{quote(user, safe='')}"
        await asyncio.to_thread(self._call, "PUT", path, everything)

    async def delete_vhost(self, vhost: str) -> None:
        await asyncio.to_thread(self._call, "DELETE", f"/vhosts/{quote(vhost, safe='')}")


@dataclass(frozen=True)
class Sandbox:
    """The demo's own database and vhost (one name for both), and how to reach them."""

    name: str
    admin_database_url: str  # the database DATABASE_URL names, on the same server
    database_url: str
    amqp_urls: tuple[str, ...]
    management: Management
    management_url: str  # where the children check the topology's arguments

    @property
    def amqp_user(self) -> str:
        return unquote(urlsplit(self.amqp_urls[0]).username or "guest")


def sandbox_for(settings: Settings, name: str, management_url: str | None) -> Sandbox:
    """The sandbox called ``name`` on the servers that the settings name."""
    url = management_url or management_url_for(settings.amqp_url[0])
    return Sandbox(
        name=name,
        admin_database_url=settings.database_url,
        database_url=with_database(settings.database_url, name),
        amqp_urls=tuple(_with_path(u, name) for u in settings.amqp_url),
        management=Management(url),
        management_url=settings.management_url or url,
    )


def _with_path(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{quote(name, safe='')}"))


@contextlib.asynccontextmanager
async def sandbox_created(sandbox: Sandbox, *, keep: bool) -> AsyncIterator[None]:
    """Create the database and the vhost; remove them afterwards unless ``keep``."""
    await _admin_sql(sandbox.admin_database_url, f'CREATE DATABASE "{sandbox.name}"')
    try:
        await sandbox.management.create_vhost(sandbox.name, sandbox.amqp_user)
        try:
            yield
        finally:
            if not keep:
                await sandbox.management.delete_vhost(sandbox.name)
    finally:
        if not keep:
            drop = f'DROP DATABASE IF EXISTS "{sandbox.name}" WITH (FORCE)'
            await _admin_sql(sandbox.admin_database_url, drop)


async def _admin_sql(url: str, statement: str) -> None:
    try:
        conn = await asyncpg.connect(url, timeout=10)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        raise ConnectionError(redact_url(f"cannot reach PostgreSQL at {url}: {exc}")) from None
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


# -- the real commands, as subprocesses ----------------------------------------------


@dataclass
class Child:
    """One ``python -m service.*`` process, its output going to a file."""

    name: str
    process: asyncio.subprocess.Process
    log: Path


class Children:
    """Starts the service's commands against the sandbox, and stops them with SIGTERM."""

    def __init__(self, sandbox: Sandbox, logs: Path) -> None:
        self.sandbox = sandbox
        self.logs = logs
        self.running: list[Child] = []  # the long-running ones: consumers and the scan

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "EXPIRY_FAILPOINT"}
        env.update(
            DATABASE_URL=self.sandbox.database_url,
            AMQP_URL=",".join(self.sandbox.amqp_urls),
            EXPIRY_MANAGEMENT_URL=self.sandbox.management_url,
            EXPIRY_LOG_FORMAT="json",  # the summary counts outcomes from these lines
            EXPIRY_HTTP_PORT="0",  # several consumers on one host: no port to share
            PYTHONUNBUFFERED="1",
        )
        env.update(extra)
        return env

    async def _spawn(self, name: str, module: str, *args: str, **env: str) -> Child:
        log = self.logs / f"{name}.log"
        with log.open("wb") as out:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                module,
                *args,
                env=self.env(**env),
                stdout=out,
                stderr=out,
                start_new_session=True,  # Ctrl-C reaches the demo, which stops them in order
            )
        return Child(name, process, log)

    async def start(self, name: str, module: str, *args: str, **env: str) -> Child:
        """Start a long-running command."""
        child = await self._spawn(name, module, *args, **env)
        self.running.append(child)
        return child

    async def run(self, name: str, module: str, *args: str) -> None:
        """Run a command to completion; raise if it fails."""
        child = await self._spawn(name, module, *args)
        async with asyncio.timeout(STOP_TIMEOUT_SECONDS):
            code = await child.process.wait()
        if code != 0:
            raise RuntimeError(f"{name} exited {code}: {tail(child.log)}")

    def dead(self) -> list[Child]:
        """Long-running children that exited."""
        return [c for c in self.running if c.process.returncode is not None]

    async def stop(self, children: Sequence[Child]) -> dict[str, int]:
        """SIGTERM, then wait (SIGKILL past the timeout); return each exit code."""
        for child in children:
            if child.process.returncode is None:
                child.process.send_signal(signal.SIGTERM)
        codes = await asyncio.gather(*(_wait_or_kill(child) for child in children))
        return {child.name: code for child, code in zip(children, codes, strict=True)}


async def _wait_or_kill(child: Child) -> int:
    try:
        async with asyncio.timeout(STOP_TIMEOUT_SECONDS):
            return await child.process.wait()
    except TimeoutError:
        child.process.kill()
        return await child.process.wait()


def tail(log: Path, lines: int = 3) -> str:
    """The last lines a child wrote."""
    text = log.read_text(errors="replace").strip().splitlines()
    return " | ".join(text[-lines:]) or "(no output)"


# -- holds and the support side ------------------------------------------------------

PLACE_HOLDS = """
INSERT INTO reservations (id, hold_until)
SELECT gen_random_uuid(), now() + make_interval(secs => $2 + random() * $3)
  FROM generate_series(1, $1)
RETURNING id, hold_until
"""
# The support side's guarded update, as any other system runs it.
CONSUME_HOLD = """
UPDATE reservations SET status = 'consumed', updated_at = now()
 WHERE id = $1 AND status = 'held'
"""


@dataclass(frozen=True)
class Hold:
    """A placed hold, and when it is due on the event loop's clock."""

    id: UUID
    hold_until: datetime
    due_at: float  # loop.time() of the deadline


async def place_holds(conn: Connection, plan: Plan) -> list[Hold]:
    """Insert the holds; map their deadlines (database clock) onto the loop's clock."""
    rows = await conn.fetch(PLACE_HOLDS, plan.holds, plan.lead, plan.spread)
    db_now: datetime = await conn.fetchval("SELECT clock_timestamp()")
    loop_now = asyncio.get_running_loop().time()
    return [
        Hold(row["id"], row["hold_until"], loop_now + (row["hold_until"] - db_now).total_seconds())
        for row in rows
    ]


@dataclass
class Support:
    """What the support side did: the holds it consumed, and how many it found expired."""

    tried: int = 0
    consumed: set[UUID] = field(default_factory=set)
    too_late: int = 0


async def support_side(
    url: str, picks: Sequence[Hold], rng: random.Random, result: Support
) -> None:
    """Consume each picked hold right at its deadline (up to 0.2 s before, 0.6 s after).

    ``result`` is filled in as it goes, so that it tells what was done even if stopped.
    """
    result.tried = len(picks)
    loop = asyncio.get_running_loop()
    async with asyncpg.create_pool(url, min_size=1, max_size=4) as pool:

        async def consume(hold: Hold) -> None:
            await asyncio.sleep(max(0.0, hold.due_at + rng.uniform(-0.2, 0.6) - loop.time()))
            async with pool.acquire() as conn:
                status = await conn.execute(CONSUME_HOLD, hold.id)
            if status == "UPDATE 1":
                result.consumed.add(hold.id)
            else:
                result.too_late += 1

        await asyncio.gather(*(consume(hold) for hold in picks))


# -- watching ------------------------------------------------------------------------

SNAPSHOT = """
SELECT count(*) FILTER (WHERE status = 'held') AS held,
       count(*) FILTER (WHERE status = 'expired') AS expired,
       count(*) FILTER (WHERE status = 'consumed') AS consumed,
       count(*) FILTER (WHERE status = 'held' AND hold_until <= now()) AS due,
       coalesce(extract(epoch FROM now() - min(hold_until)
                FILTER (WHERE status = 'held' AND hold_until <= now())), 0)::float8 AS oldest_due
  FROM reservations
"""


@dataclass(frozen=True)
class Snapshot:
    """One look at the holds and the queues."""

    held: int
    expired: int
    consumed: int
    due: int
    oldest_due: float
    queued: int
    retrying: int
    dead: int

    @property
    def settled(self) -> bool:
        return self.held == 0 and self.queued == 0 and self.retrying == 0


class QueueProbe:
    """Exact ready and consumer counts of the sandbox's queues (passive declares)."""

    def __init__(self, connection: AbstractConnection, retry_delays: Sequence[int]) -> None:
        self.connection = connection
        self.retry_queues = [retry_queue(delay) for delay in retry_delays]
        self._channel: AbstractChannel | None = None

    async def _counts(self, name: str) -> tuple[int, int]:
        if self._channel is None or self._channel.is_closed:
            self._channel = await self.connection.channel()
        try:
            declared = await self._channel.declare_queue(name, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return 0, 0  # not declared yet (and the broker closed the channel)
        result = declared.declaration_result
        return int(result.message_count or 0), int(result.consumer_count or 0)

    async def ready(self, name: str) -> int:
        return (await self._counts(name))[0]

    async def consumers(self) -> int:
        return (await self._counts(QUEUE))[1]

    async def retrying(self) -> int:
        return sum([await self.ready(name) for name in self.retry_queues])


async def snapshot(conn: Connection, probe: QueueProbe) -> Snapshot:
    """The state of the holds and the queues right now."""
    row = await conn.fetchrow(SNAPSHOT)
    assert row is not None  # an aggregate always yields a row
    return Snapshot(
        held=row["held"],
        expired=row["expired"],
        consumed=row["consumed"],
        due=row["due"],
        oldest_due=row["oldest_due"],
        queued=await probe.ready(QUEUE),
        retrying=await probe.retrying(),
        dead=await probe.ready(DEAD_QUEUE),
    )


class Progress:
    """A live line on a terminal; a line a second otherwise."""

    def __init__(self, total: int, out: IO[str]) -> None:
        self.total = total
        self.out = out
        self.tty = out.isatty()
        self.tick = 0.25 if self.tty else 1.0

    def show(self, snap: Snapshot, elapsed: float) -> None:
        facts = (
            f"held {snap.held:>5} (due {snap.due:>4}, oldest due {snap.oldest_due:4.1f}s)  "
            f"expired {snap.expired:>5}  consumed {snap.consumed:>4}  "
            f"retrying {snap.retrying}  dead {snap.dead}  queued {snap.queued:>4}"
        )
        if self.tty:
            done = (self.total - snap.held) / max(1, self.total)
            bar = "#" * round(done * 20)
            line = f"  [{bar:<20}] {done:4.0%} {elapsed:5.1f}s  {facts}"
            width = shutil.get_terminal_size().columns - 1  # a wrapped line would not redraw
            self.out.write(f"\r{line[:width]}\x1b[K")
        else:
            self.out.write(f"  {elapsed:5.1f}s  {facts}\n")
        self.out.flush()

    def finish(self) -> None:
        if self.tty:
            self.out.write("\n")
            self.out.flush()


async def watch(
    conn: Connection,
    probe: QueueProbe,
    children: Children,
    support: asyncio.Task[None],
    give_up: Callable[[], bool],
) -> bool:
    """Show progress until every hold ended and the queues are empty (True), or give up."""
    total: int = await conn.fetchval("SELECT count(*) FROM reservations")
    progress = Progress(total, sys.stdout)
    started = time.monotonic()
    try:
        while True:
            snap = await snapshot(conn, probe)
            progress.show(snap, time.monotonic() - started)
            if support.done() and snap.settled:
                return True
            if give_up() or children.dead():
                return False
            await asyncio.sleep(progress.tick)
    finally:
        progress.finish()


# -- the summary ---------------------------------------------------------------------

FINAL_STATES = """
WITH t AS (SELECT reservation_id, count(*) AS n FROM reservation_transitions GROUP BY 1)
SELECT count(*) AS placed,
       count(*) FILTER (WHERE r.status = 'expired') AS expired,
       count(*) FILTER (WHERE r.status = 'consumed') AS consumed,
       count(*) FILTER (WHERE r.status = 'held') AS held,
       count(*) FILTER (WHERE r.status = 'held' AND r.hold_until <= now()) AS held_past_deadline,
       count(*) FILTER (WHERE r.status = 'expired' AND coalesce(t.n, 0) <> 1) AS expired_not_once,
       count(*) FILTER (WHERE r.status = 'consumed' AND coalesce(t.n, 0) > 0)
           AS consumed_with_transition,
       coalesce(min(t.n) FILTER (WHERE r.status = 'expired'), 0) AS min_transitions,
       coalesce(max(t.n) FILTER (WHERE r.status = 'expired'), 0) AS max_transitions
  FROM reservations r LEFT JOIN t ON t.reservation_id = r.id
"""
LAG = """
SELECT coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY lag), 0)::float8 AS p50,
       coalesce(percentile_cont(0.95) WITHIN GROUP (ORDER BY lag), 0)::float8 AS p95,
       coalesce(max(lag), 0)::float8 AS max,
       coalesce(extract(epoch FROM max(at) - min(hold_until)), 0)::float8 AS window
  FROM (SELECT t.at, r.hold_until, extract(epoch FROM t.at - r.hold_until) AS lag
          FROM reservation_transitions t JOIN reservations r ON r.id = t.reservation_id
         WHERE t.to_status = 'expired') AS expiries
"""
BY_WORKER = "SELECT worker, count(*) AS n FROM reservation_transitions GROUP BY 1 ORDER BY 1"


@dataclass(frozen=True)
class Final:
    """What the database and the queues hold once everything stopped."""

    states: dict[str, int]
    lag: dict[str, float]
    by_worker: dict[str, int]
    dead: int
    queued: int


async def final_state(conn: Connection, probe: QueueProbe) -> Final:
    """Final states, expiry lag, expirations per consumer, queue depths."""
    states = await conn.fetchrow(FINAL_STATES)
    lag = await conn.fetchrow(LAG)
    assert states is not None  # aggregates always yield a row
    assert lag is not None
    return Final(
        states=dict(states.items()),
        lag=dict(lag.items()),
        by_worker={row["worker"]: row["n"] for row in await conn.fetch(BY_WORKER)},
        dead=await probe.ready(DEAD_QUEUE),
        queued=await probe.ready(QUEUE),
    )


def delivery_outcomes(logs: Iterable[Path]) -> Counter[str]:
    """Count the consumers' ``expiry.outcome``, ``expiry.retry``, ``expiry.dead_letter`` lines."""
    counts: Counter[str] = Counter()
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if entry.get("event") == "expiry.outcome" and "outcome" in entry:
                    counts[str(entry["outcome"])] += 1
                elif entry.get("event") in ("expiry.retry", "expiry.dead_letter"):
                    counts[str(entry["event"]).removeprefix("expiry.")] += 1
    return counts


@dataclass(frozen=True)
class Report:
    """Everything the summary shows, and whether the run passed."""

    settled: bool
    elapsed: float
    final: Final
    support: Support
    exit_codes: dict[str, int]
    deliveries: Counter[str]

    def checks(self) -> list[tuple[str, bool]]:
        s = self.final.states
        return [
            ("every hold ended in exactly one state", s["expired"] + s["consumed"] == s["placed"]),
            ("no held hold past its deadline", s["held"] == 0 and s["held_past_deadline"] == 0),
            (
                "exactly one transition per expired hold, none per consumed hold",
                s["expired_not_once"] == 0 and s["consumed_with_transition"] == 0,
            ),
            (
                "every consumed hold was consumed by the support side",
                s["consumed"] == len(self.support.consumed),
            ),
            ("zero dead letters", self.final.dead == 0),
            ("every process exited 0", all(code == 0 for code in self.exit_codes.values())),
            ("settled before the timeout", self.settled),
        ]

    @property
    def ok(self) -> bool:
        return all(passed for _, passed in self.checks())


def summary(report: Report) -> list[str]:
    """The summary table, one line each, then the checks."""
    s, lag, sup, d = report.final.states, report.final.lag, report.support, report.deliveries
    rate = s["expired"] / lag["window"] if lag["window"] > 0 else 0.0
    per_consumer = ", ".join(f"{w} {n}" for w, n in report.final.by_worker.items())
    rows = [
        ("holds placed", f"{s['placed']}"),
        ("expired by the service", f"{s['expired']}"),
        ("consumed by support", f"{s['consumed']}"),
        (
            "support at the deadline",
            f"tried {sup.tried}: {len(sup.consumed)} consumed, "
            f"{sup.too_late} found already expired",
        ),
        ("still held", f"{s['held']} ({s['held_past_deadline']} past their deadline)"),
        ("ended in exactly one state", f"{s['expired'] + s['consumed']} of {s['placed']}"),
        (
            "transitions per expired hold",
            f"min {s['min_transitions']}, max {s['max_transitions']} "
            f"({s['expired_not_once']} not exactly 1; "
            f"{s['consumed_with_transition']} on consumed holds)",
        ),
        ("dead letters", f"{report.final.dead}"),
        ("left in the work queue", f"{report.final.queued}"),
        (
            "deliveries",
            f"{d['expired']} expired, {d['already-done']} already-done, "
            f"{d['not-eligible']} not-eligible, {d['retry']} retried, "
            f"{d['dead_letter']} dead-lettered",
        ),
        ("expirations by consumer", per_consumer or "none"),
        (
            "expiry lag after deadline",
            f"p50 {lag['p50']:.2f}s, p95 {lag['p95']:.2f}s, max {lag['max']:.2f}s",
        ),
        ("elapsed", f"{report.elapsed:.1f}s"),
        (
            "throughput",
            f"{rate:.0f} expirations/s as the holds came due ({s['expired']} in the "
            f"{lag['window']:.1f}s from the first deadline to the last expiry)",
        ),
    ]
    lines = [f"  {label:<29} {value}" for label, value in rows]
    lines += [f"  [{'ok' if passed else 'FAILED'}] {what}" for what, passed in report.checks()]
    return lines


# -- the run -------------------------------------------------------------------------


def say(text: str) -> None:
    """One line of the demo's own story, on stdout."""
    print(text, flush=True)


async def _wait_for_consumers(children: Children, probe: QueueProbe, count: int) -> None:
    async with asyncio.timeout(STOP_TIMEOUT_SECONDS):
        while await probe.consumers() < count:
            if dead := children.dead():
                raise RuntimeError(f"{dead[0].name} exited: {tail(dead[0].log)}")
            await asyncio.sleep(0.2)


async def _finish(support: asyncio.Task[None]) -> None:
    if not support.done():
        support.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await support


@dataclass
class Run:
    """One demo run, in a created sandbox."""

    plan: Plan
    settings: Settings
    sandbox: Sandbox
    logs: Path
    stop: asyncio.Event
    rng: random.Random = field(default_factory=random.Random)

    async def __call__(self) -> Report:
        started = time.monotonic()
        children = Children(self.sandbox, self.logs)
        say("[1/5] migrate (python -m service.migrate), declare the topology (service.declare)")
        await children.run("migrate", "service.migrate")
        await declare(self.settings.model_copy(update={"amqp_url": self.sandbox.amqp_urls}))
        connection = await aio_pika.connect(self.sandbox.amqp_urls[0])
        conn = await asyncpg.connect(self.sandbox.database_url)
        try:
            probe = QueueProbe(connection, self.settings.retry_delays)
            settled, support, codes = await self._pipeline(children, conn, probe)
            final = await final_state(conn, probe)
        finally:
            await children.stop(children.running)
            await conn.close()
            await connection.close()
        outcomes = await asyncio.to_thread(delivery_outcomes, self.logs.glob("consumer-*.log"))
        return Report(settled, time.monotonic() - started, final, support, codes, outcomes)

    async def _pipeline(
        self, children: Children, conn: Connection, probe: QueueProbe
    ) -> tuple[bool, Support, dict[str, int]]:
        plan = self.plan
        say(f"[2/5] {plan.consumers} consumers (python -m service.consume)")
        consumers = [
            await children.start(
                f"consumer-{i}", "service.consume", EXPIRY_WORKER_ID=f"demo-consumer-{i}"
            )
            for i in range(1, plan.consumers + 1)
        ]
        await _wait_for_consumers(children, probe, plan.consumers)
        say(f"[3/5] the scan, every {plan.scan_every:g}s (python -m service.produce --every)")
        scanner = await children.start("scan", "service.produce", "--every", f"{plan.scan_every}")
        holds = await place_holds(conn, plan)
        picks = self.rng.sample(holds, round(len(holds) * plan.support_share))
        say(
            f"[4/5] placed {len(holds)} holds due {plan.lead:g}-{plan.lead + plan.spread:g}s "
            f"from now; the support side consumes {len(picks)} of them at their deadline"
        )
        done_by_support = Support()
        support = asyncio.create_task(
            support_side(self.sandbox.database_url, picks, self.rng, done_by_support)
        )
        say("[5/5] watching: held (due, oldest due age) / expired / consumed / retrying / dead")
        deadline = time.monotonic() + plan.lead + plan.spread + plan.timeout
        settled = await watch(
            conn,
            probe,
            children,
            support,
            lambda: self.stop.is_set() or time.monotonic() > deadline,
        )
        if self.stop.is_set():
            say("interrupted: stopping")
        codes = await children.stop([scanner, *consumers])
        say(f"stopped with SIGTERM: {', '.join(f'{n} exit {c}' for n, c in codes.items())}")
        await _finish(support)
        return settled, done_by_support, codes


def _plan(args: argparse.Namespace) -> Plan:
    return Plan(
        holds=args.holds,
        consumers=args.consumers,
        lead=1.0,
        spread=args.spread,
        support_share=args.support_share,
        scan_every=args.scan_every,
        timeout=args.timeout,
        keep=args.keep,
        name=args.name or f"expiry_demo_{secrets.token_hex(4)}",
    )


def _introduce(plan: Plan, sandbox: Sandbox, logs: Path) -> None:
    say(
        f"expiry-service demo: {plan.holds} holds, {plan.consumers} consumers, "
        f"a scan every {plan.scan_every:g}s"
    )
    say(f"  database  {redact_url(sandbox.database_url)}")
    say(f"  vhost     {sandbox.name} on {redact_url(sandbox.amqp_urls[0])}")
    say(f"  logs      {logs}")


def _farewell(plan: Plan, sandbox: Sandbox, logs: Path, *, ok: bool) -> None:
    if plan.keep:
        say(f"kept for inspection: database {sandbox.name}, vhost {sandbox.name}, logs {logs}")
        say(f"  remove them with: DROP DATABASE {sandbox.name}; DELETE /api/vhosts/{sandbox.name}")
        return
    say(f"removed the database and the vhost {sandbox.name}")
    if ok:
        shutil.rmtree(logs, ignore_errors=True)
    else:
        say(f"the processes' logs are kept in {logs}")


async def _main(settings: Settings, args: argparse.Namespace) -> int:
    plan = _plan(args)
    sandbox = sandbox_for(settings, plan.name, DemoEnvironment().management_url)
    logs = Path(tempfile.mkdtemp(prefix=f"{plan.name}-logs-"))
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    _introduce(plan, sandbox, logs)
    async with sandbox_created(sandbox, keep=plan.keep):
        report = await Run(plan, settings, sandbox, logs, stop)()
    say(f"\nsummary ({plan.name})")
    for line in summary(report):
        say(line)
    say(f"RESULT: {'OK' if report.ok else 'FAILED'}")
    _farewell(plan, sandbox, logs, ok=report.ok)
    return 0 if report.ok else 1


def _bounded(kind: Callable[[str], Any], low: float, high: float) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low:g} and {high:g}")
        return value

    return parse


def _name(text: str) -> str:
    if not NAME_PATTERN.match(text):
        raise argparse.ArgumentTypeError("lower-case letters, digits and _, starting with a letter")
    return text


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m service.demo",
        description=(
            "Run the service against a new database and vhost of its own: migrate, several "
            "consumers, the scan on a timer; place holds due over the next seconds, consume "
            "some at their deadline, watch them end, and check that each ended in exactly one "
            "state. Removes what it created unless --keep. Exit 0 only if every check passed."
        ),
    )
    add = parser.add_argument
    add(
        "--holds",
        type=_bounded(int, 1, 1_000_000),
        default=DEFAULT_HOLDS,
        help=f"holds to place (default {DEFAULT_HOLDS})",
    )
    add(
        "--consumers",
        type=_bounded(int, 1, 32),
        default=DEFAULT_CONSUMERS,
        help=f"consumer processes (default {DEFAULT_CONSUMERS})",
    )
    add(
        "--spread",
        type=_bounded(float, 0, 3600),
        default=5.0,
        metavar="SECONDS",
        help="deadlines spread over this many seconds, from 1 s on (default 5)",
    )
    add(
        "--support-share",
        type=_bounded(float, 0, 1),
        default=0.1,
        metavar="SHARE",
        help="share of holds consumed by the support side at their deadline (default 0.1)",
    )
    add(
        "--scan-every",
        type=_bounded(float, 0.05, 60),
        default=0.5,
        metavar="SECONDS",
        help="scan interval (default 0.5)",
    )
    add(
        "--timeout",
        type=_bounded(float, 1, 3600),
        default=120.0,
        metavar="SECONDS",
        help="after the last deadline, wait at most this long (default 120)",
    )
    add(
        "--keep",
        action="store_true",
        help="keep the database, the vhost and the logs for inspection",
    )
    add(
        "--name",
        type=_name,
        help="name of the database and the vhost (default expiry_demo_<random>)",
    )
    return parser


def main() -> None:
    """Entry point."""
    run_command(_parser(), _main)


if __name__ == "__main__":
    main()
