"""The measurements of the webhooks (issue 38): what K deliverers deliver to a local
endpoint given a backlog, and what a delivery row written with each event costs one
consumer (``bench.webhook_phases`` records them).

- **Deliveries/s**: K ``python -m service.deliver`` processes (the shipped settings:
  ``EXPIRY_WEBHOOK_CONCURRENCY`` 8 per process) serve one endpoint whose rate limit is the
  most an endpoint may have (``RATE_OFF``: far above what they reach here, so effectively
  off), on a ``bench.receiver`` in a process of its own on the loopback (it answers
  ``200`` at once and keeps nothing but counts). Once every deliverer has started (and so
  registered the endpoint), N events are written straight into the outbox in one
  statement (``bench.outbox.insert_events``, as the trigger writes them), and its
  statement trigger writes the N deliveries in the same transaction. The rate is N over
  the time from the first request the receiver got to the last (its own clock); the run
  ends when no delivery is left (a dead one, or no progress for a minute, fails it), and
  the receiver must have got N distinct ``webhook-id``\\ s (repeats, from a lapsed lease,
  are counted).
- **The cost on the expiry rate** is ``bench.event_runs.EventRuns.backlog`` with the
  endpoint registered before the consumer starts, or none (``bench.webhook_phases``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench import cpu, db, outbox
from bench.measurements import Bench, total_cpu
from bench.procs import Child, ChildFailed, tree_usage
from bench.supervisor import POLL_SECONDS, SINK_READY_SECONDS, STALL_SECONDS

ENDPOINT = "bench"
RATE_OFF = 10_000.0  # the most Endpoint.rate_per_second allows
LOOPBACK = "127.0.0.0/8"

LEFT = """
SELECT count(*) FILTER (WHERE NOT dead)::int AS pending,
       count(*) FILTER (WHERE dead)::int AS dead
  FROM webhook_deliveries
"""
WRITTEN = "SELECT count(*)::int FROM webhook_deliveries"


def endpoint_env(port: int, name: str = ENDPOINT) -> dict[str, str]:
    """``EXPIRY_WEBHOOKS``: one endpoint on the receiver at ``port`` (plain HTTP on the
    loopback, allowed), a fresh secret, the rate limit effectively off."""
    endpoint = {
        "name": name,
        "url": f"http://127.0.0.1:{port}/hook",
        "secret": "whsec_" + base64.b64encode(os.urandom(32)).decode(),
        "rate_per_second": RATE_OFF,
        "allow_networks": [LOOPBACK],
    }
    return {"EXPIRY_WEBHOOKS": json.dumps([endpoint])}


async def written(conn: db.Connection) -> int:
    """Delivery rows, pending or dead."""
    value: int = await conn.fetchval(WRITTEN)
    return value


@dataclass(frozen=True)
class Received:
    """What the receiver was sent (``bench.receiver``'s tally)."""

    requests: int
    distinct: int  # distinct webhook-ids
    invalid: int
    seconds: float  # from the first request to the last

    @property
    def rate(self) -> float:
        """Distinct deliveries over the time from the first request to the last."""
        return self.distinct / self.seconds if self.seconds > 0 else 0.0

    @property
    def repeats(self) -> int:
        return self.requests - self.distinct


@dataclass(frozen=True)
class Receiver:
    """A listening ``bench.receiver``: its port, its process, the file of its tally."""

    port: int
    child: Child
    out: Path

    def received(self) -> Received:
        """Its tally (once it has stopped)."""
        tally = json.loads(self.out.read_text())
        seconds = float(tally["last"]) - float(tally["first"])
        return Received(
            int(tally["requests"]), int(tally["distinct"]), int(tally["invalid"]), seconds
        )


# What the webhook tables hold after a run: the attempt log (every partition and index,
# after VACUUM ANALYZE, as bench.table_sizes measures), and the deliveries left (the
# delivered ones go at once: none should be).
KEPT = """
SELECT (SELECT count(*) FROM webhook_attempts) AS attempts,
       (SELECT coalesce(sum(pg_total_relation_size(p.relid)), 0)
          FROM pg_partition_tree('webhook_attempts') AS p)::bigint AS attempts_bytes,
       (SELECT count(*) FROM webhook_deliveries) AS deliveries
"""


@dataclass(frozen=True)
class Kept:
    """The webhook tables after a run."""

    attempts: int
    attempts_bytes: int
    deliveries: int


async def kept(conn: db.Connection) -> Kept:
    """What the webhook tables hold now."""
    await conn.execute("VACUUM ANALYZE webhook_attempts, webhook_deliveries")
    row = await conn.fetchrow(KEPT)
    assert row is not None
    return Kept(row["attempts"], row["attempts_bytes"], row["deliveries"])


@dataclass(frozen=True)
class DeliverRun:
    """K deliverers working off N deliveries to one endpoint."""

    deliverers: int
    deliveries: int
    received: Received
    cpu_seconds: float  # the deliverers', from the backlog's write to the last delivery
    receiver_cpu_seconds: float  # the receiver's, over the same time
    machine: cpu.Shares  # the same time: the machine, PostgreSQL, RabbitMQ
    kept: Kept  # what the webhook tables hold once every delivery is done

    @property
    def attempt_bytes_per_1000(self) -> float:
        """``webhook_attempts`` on disk per 1,000 deliveries (what retention bounds)."""
        return self.kept.attempts_bytes / self.deliveries * 1000 if self.deliveries else 0.0

    @property
    def cpu_us_per_delivery(self) -> float:
        return self.cpu_seconds / self.deliveries * 1e6 if self.deliveries else 0.0

    @property
    def cpu_share(self) -> float:
        """CPU of one deliverer as a share of one core, over the run."""
        busy = self.machine.seconds * self.deliverers
        return self.cpu_seconds / busy if busy > 0 else 0.0

    @property
    def receiver_cores(self) -> float:
        seconds = self.machine.seconds
        return self.receiver_cpu_seconds / seconds if seconds > 0 else 0.0


@dataclass(frozen=True)
class WebhookRuns:
    """The webhooks' measurements, on the benchmark's ``Bench``."""

    bench: Bench

    async def deliver(self, deliverers: int) -> DeliverRun:
        """K deliverers, already started, given N deliveries at once (see the module)."""
        bench, conn = self.bench, self.bench.conn
        count = bench.options.holds
        await db.reset(conn)
        async with self._receiver(deliverers) as receiver:
            children = await bench.supervisor.deliverers(deliverers, endpoint_env(receiver.port))
            try:
                before = [tree_usage(child.pid) for child in children]
                receiver_before = tree_usage(receiver.child.pid)
                machine = cpu.snapshot(bench.servers)
                await outbox.insert_events(conn, count)
                await self._drained(children, [receiver.child])
                shares = cpu.shares(bench.servers, machine, cpu.snapshot(bench.servers))
                after = [tree_usage(child.pid) for child in children]
                receiver_after = tree_usage(receiver.child.pid)
            finally:
                await bench.supervisor.stop(children)
        received = receiver.received()
        if received.distinct != count or received.invalid:
            raise RuntimeError(
                f"the receiver got {received.distinct} distinct deliveries of {count} "
                f"({received.requests} requests, {received.invalid} unreadable)"
            )
        return DeliverRun(
            deliverers,
            count,
            received,
            total_cpu(before, after),
            receiver_after.cpu_seconds - receiver_before.cpu_seconds,
            shares,
            await kept(conn),
        )

    @contextlib.asynccontextmanager
    async def _receiver(self, deliverers: int) -> AsyncIterator[Receiver]:
        """A ``bench.receiver`` listening for the block, stopped (exit 0) at its end."""
        supervisor = self.bench.supervisor
        name = supervisor.name(f"receiver-for-{deliverers}")
        logs = supervisor.procs.logs
        port_file, out = logs / f"{name}.port", logs / f"{name}.json"
        child = supervisor.procs.start(
            name, "bench.receiver", "--port-file", str(port_file), "--out", str(out)
        )
        try:
            async with asyncio.timeout(SINK_READY_SECONDS):
                while not port_file.exists() or not port_file.read_text():
                    supervisor.procs.check_alive([child])
                    await asyncio.sleep(POLL_SECONDS / 2)
            yield Receiver(int(port_file.read_text()), child, out)
        finally:
            await supervisor.stop([child])

    async def _drained(self, deliverers: Sequence[Child], others: Sequence[Child]) -> None:
        """Until no delivery is left; ``ChildFailed`` if a process exits, a delivery is
        dead, or no delivery is made for ``STALL_SECONDS``."""
        conn, procs = self.bench.conn, self.bench.supervisor.procs
        left, progress_at = self.bench.options.holds, time.monotonic()
        while left:
            procs.check_alive([*deliverers, *others])
            await asyncio.sleep(POLL_SECONDS)
            row = await conn.fetchrow(LEFT)
            assert row is not None
            if row["dead"]:
                raise ChildFailed(f"{row['dead']} deliveries dead (see the deliverers' logs)")
            if row["pending"] < left:
                left, progress_at = row["pending"], time.monotonic()
            elif time.monotonic() - progress_at > STALL_SECONDS:
                raise ChildFailed(f"the deliverers stalled: {left} deliveries left")
