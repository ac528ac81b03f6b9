"""The measurements of the events (issue 37): what the outbox costs the consumer, what one
relay publishes alone and beside two consumers, and commit-to-confirm at a steady rate.

Each resets the database and runs the real commands (``service.consume``,
``service.produce``, ``service.relay``) in the benchmark's sandbox, where a quorum
queue of its own is bound to ``expiry.events`` (the relay publishes mandatory: an event
no queue takes is never confirmed) and purged after each run.

- **Events off** is the outbox's trigger disabled (``ALTER TABLE ... DISABLE TRIGGER``, as
  the owner of the sandbox's tables; enabled again right after): the consumer's
  transaction then writes no event. It still sends its coalesced NOTIFY after a commit
  (the service has no setting that stops it; nobody listens then).
- **The relay's rate** is taken from its marks (``bench.outbox``): the events of every
  batch but the first over the time from the first mark to the last.
- **Beside two consumers**, the outbox holds ``PREFILL_PER_HOLD`` events per hold before
  they start (written straight into it), so that the relay is never short of work while
  they expire theirs: its rate over their window (until it has sent those) is what it
  can publish while they run at full speed on the same cores, not the rate at which
  they feed it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from bench import db, outbox, webhook_runs
from bench.amqp import EVENTS_QUEUE
from bench.measurements import SUSTAINED_LEAD_SECONDS, Bench, ConsumeRun
from bench.procs import Child, ChildFailed, tree_usage
from bench.recording import free_port
from bench.scrape import BATCH_DURATION, COMMIT_TO_CONFIRM, EMPTY, Histogram, histogram, scrape
from bench.supervisor import POLL_SECONDS, STALL_SECONDS
from service.adapters.postgres import webhook_endpoints

PREFILL_PER_HOLD = 4


@dataclass(frozen=True)
class RelayRun:
    """One relay draining a full outbox alone."""

    events: int
    marks: outbox.RelayRate
    cpu_seconds: float  # the relay's, from its readiness to the last mark

    @property
    def cpu_us_per_event(self) -> float:
        return self.cpu_seconds / self.events * 1e6 if self.events else 0.0


@dataclass(frozen=True)
class BesideRun:
    """K consumers expiring a backlog while one relay publishes beside them."""

    consume: ConsumeRun
    marks: outbox.RelayRate  # the relay's, over the consumers' first to last expiry
    prefilled: int
    short_of_work: bool  # the relay had sent the whole prefill before their first expiry


@dataclass(frozen=True)
class LatencyRun:
    """Holds due at a steady rate, K consumers, a scanner and the relays."""

    consume: ConsumeRun
    lag: db.Lag
    confirm: Histogram  # the relays' commit-to-confirm histograms, whole run, added up
    batches: Histogram  # the relays' batch durations (claim, publish, confirms, mark)
    mark: outbox.Spread  # commit to mark, from expiry_events_sent
    relay_cpu_share: float  # of one core per relay, from the first due hold to the drained outbox


def _relay_env(port: int) -> dict[str, str]:
    return {"EXPIRY_HTTP_PORT": str(port)} if port else {}


def _cpu(relays: Sequence[Child]) -> float:
    """The relays' CPU seconds so far, added up."""
    return sum(tree_usage(relay.pid).cpu_seconds for relay in relays)


def _added(texts: Sequence[str], name: str) -> Histogram:
    """Histogram ``name`` of each scrape, added up."""
    found = EMPTY
    for text in texts:
        mine = histogram(text, name)
        if mine.count:  # a relay that published nothing has no buckets
            found = found.plus(mine) if found.count else mine
    return found


async def _check_written(conn: db.Connection, events: int, endpoints: int) -> None:
    """``RuntimeError`` unless the outbox got ``events`` (pending or sent) and each of
    them a delivery for each of ``endpoints``."""
    written = await outbox.pending(conn) + await outbox.sent(conn)
    if written != events:
        raise RuntimeError(f"{written} events written, {events} expected")
    hooks = await webhook_runs.written(conn)
    if hooks != events * endpoints:
        raise RuntimeError(f"{hooks} deliveries for {events} events to {endpoints} endpoint(s)")


@dataclass(frozen=True)
class EventRuns:
    """The events' measurements, on the benchmark's ``Bench`` (its connection, its
    supervisor, its options)."""

    bench: Bench

    async def backlog(
        self, *, events: bool, relay: bool = False, endpoints: Sequence[str] = ()
    ) -> ConsumeRun:
        """One consumer works off the backlog: with the outbox's trigger off or on, with
        a relay publishing beside it or none, and with ``endpoints`` registered (each
        event then writes a delivery for each: none is delivered) or none."""
        bench, conn = self.bench, self.bench.conn
        holds = bench.options.holds
        await bench.scan(holds)
        if endpoints:
            await webhook_endpoints.register(conn, endpoints)
        if not events:
            await outbox.set_trigger(conn, enabled=False)
        try:
            async with self._relay(1 if relay else 0) as relays:
                children = await bench.supervisor.consumers(1, {})
                try:
                    run = await bench.work_off(children, holds, also=relays)
                finally:
                    await bench.supervisor.stop(children)
                if relay:
                    await self._drained(relays)
        finally:
            if not events:
                await outbox.set_trigger(conn, enabled=True)
        await _check_written(conn, holds if events else 0, len(endpoints))
        await self._emptied()
        return run

    async def relay_alone(self) -> RelayRun:
        """One relay, started on an empty outbox, then given N events at once."""
        bench, conn = self.bench, self.bench.conn
        holds = bench.options.holds
        await db.reset(conn)
        async with self._relay() as (relay,):
            before = tree_usage(relay.pid)
            since = await outbox.now(conn)
            await outbox.insert_events(conn, holds)
            await conn.execute("NOTIFY expiry_events")  # as a consumer does after its commit
            await self._drained([relay])
            cpu = tree_usage(relay.pid).cpu_seconds - before.cpu_seconds
        marks = await outbox.relay_rate(conn, since, await outbox.now(conn))
        await self._emptied()
        return RelayRun(holds, marks, cpu)

    async def relay_beside(self, consumers: int) -> BesideRun:
        """K consumers on N due holds while the relays (``--relays``, 1) publish the
        outbox, which holds ``PREFILL_PER_HOLD`` x N events before they start. The
        relays' rate is taken from the consumers' first expiry until the events written
        ahead were sent (or their last expiry, if sooner): while they were never short of
        work. If those were all sent before the first expiry, over the consumers' whole
        window and on to the last mark (the relays then published as they expired, and
        their rate is at most the consumers': a lower bound)."""
        bench, conn = self.bench, self.bench.conn
        holds = bench.options.holds
        prefill = PREFILL_PER_HOLD * holds
        await bench.scan(holds)
        await outbox.insert_events(conn, prefill)
        async with self._relay(bench.options.relays) as relays:
            children = await bench.supervisor.consumers(consumers, {})
            try:
                run = await bench.work_off(children, holds, also=relays)
            finally:
                await bench.supervisor.stop(children)
            await self._drained(relays)
        first, last = await outbox.expiries_span(conn)
        done, final = await outbox.mark_of_nth(conn, prefill), await outbox.last_mark(conn)
        if done is None or done < first:
            short, until = True, final
        else:
            short, until = False, min(last, done)
        marks = await outbox.relay_rate(conn, first, until)
        await self._emptied()
        return BesideRun(run, marks, prefill, short)

    async def latency(self) -> LatencyRun:
        """The sustained run (holds due at the options' rate, the scan every
        ``scan_every`` s, the largest number of consumers) with the relays (``--relays``,
        1) serving their /metrics; their commit-to-confirm histograms, added up, once the
        outbox is empty."""
        bench, conn, options = self.bench, self.bench.conn, self.bench.options
        holds = max(1, round(options.rate * options.duration))
        await db.reset(conn)
        ports = [free_port() for _ in range(options.relays)]
        async with self._relay(options.relays, ports) as relays:
            children = await bench.supervisor.consumers(options.sustained_consumers, {})
            scans = bench.supervisor.scanners(1)
            try:
                await bench.supervisor.first_scan(scans[0], children)
                await db.insert_spread(conn, holds, lead=SUSTAINED_LEAD_SECONDS, rate=options.rate)
                began, cpu = time.monotonic(), _cpu(relays)
                run = await bench.work_off(children, holds, also=[*scans, *relays])
            finally:
                await bench.supervisor.stop([*scans, *children])
            await self._drained(relays)
            share = (_cpu(relays) - cpu) / (time.monotonic() - began) / len(relays)
            texts = [await scrape(port) for port in ports]
        await self._emptied()
        return LatencyRun(
            run,
            await db.lag(conn),
            _added(texts, COMMIT_TO_CONFIRM),
            _added(texts, BATCH_DURATION),
            await outbox.commit_to_mark(conn),
            share,
        )

    @contextlib.asynccontextmanager
    async def _relay(self, count: int = 1, ports: Sequence[int] = ()) -> AsyncIterator[list[Child]]:
        """``count`` relays (the reader queue bound) running for the block, stopped at its
        end with their exit codes checked; each serving /metrics on its port of ``ports``
        (when given)."""
        await self.bench.probe.bind_events()
        relays: list[Child] = []
        try:
            for number in range(count):
                port = ports[number] if number < len(ports) else 0
                relays.append(await self.bench.supervisor.relay(_relay_env(port)))
            yield relays
        finally:
            await self.bench.supervisor.stop(relays)

    async def _emptied(self) -> None:
        """The reader queue empty again (declared first: a run without a relay may be the
        first)."""
        await self.bench.probe.bind_events()
        await self.bench.probe.purge(EVENTS_QUEUE)

    async def _drained(self, relays: Sequence[Child]) -> None:
        """Until the outbox is empty; ``ChildFailed`` if a relay exits or it stalls."""
        conn, procs = self.bench.conn, self.bench.supervisor.procs
        left, progress_at = await outbox.pending(conn), time.monotonic()
        while left:
            procs.check_alive(relays)
            await asyncio.sleep(POLL_SECONDS)
            now = await outbox.pending(conn)
            if now < left:
                left, progress_at = now, time.monotonic()
            elif time.monotonic() - progress_at > STALL_SECONDS:
                raise ChildFailed(f"the relay stalled: {left} events pending")
