"""The raw limits the service is compared with: the broker alone (``bench.raw``: publish
with confirms, then consume + ack, each in a subprocess; no database) and the database
alone (the batched guarded update, 200 ids per statement, one connection; no broker).

The raw consume + ack is timed as the service's backlog drain is: from its first
delivery to its last ack.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from bench import db
from bench.amqp import Probe
from bench.procs import Child, Usage
from bench.raw import Measured
from bench.supervisor import SCAN_TIMEOUT_SECONDS, Supervisor

BATCH_UPDATE_SIZE = 200


@dataclass(frozen=True)
class RawRun:
    """The broker alone: publish with confirms, then consume + ack, in subprocesses."""

    publish: Measured
    consume: Measured
    consume_usage: Usage


def read_measured(path: Path) -> Measured:
    """A ``bench.raw`` result file."""
    data = json.loads(path.read_text())
    return Measured(int(data["count"]), float(data["seconds"]), float(data["cpu_seconds"]))


@dataclass(frozen=True)
class Limits:
    """Measures the two limits in the sandbox: ``holds`` commands or rows each time."""

    supervisor: Supervisor
    probe: Probe
    conn: db.Connection
    amqp_url: str
    holds: int

    async def raw(self) -> RawRun:
        """Publish N commands with confirms, then consume + ack them, with no database."""
        await self.probe.delete_raw()
        count = str(self.holds)
        publish = await self._raw("raw-publish", "publish", "--count", count, "--window", "500")
        consume = await self._raw(
            "raw-consume", "consume", "--count", count, "--prefetch", "1000", "--ack-every", "100"
        )
        await self.probe.delete_raw()
        return RawRun(
            read_measured(publish.log.with_suffix(".json")),
            read_measured(consume.log.with_suffix(".json")),
            consume.usage(),
        )

    async def _raw(self, what: str, *args: str) -> Child:
        name = self.supervisor.name(what)
        procs = self.supervisor.procs
        out = procs.logs / f"{name}.json"
        return await procs.run(
            name,
            "bench.raw",
            *args,
            "--url",
            self.amqp_url,
            "--out",
            str(out),
            timeout=SCAN_TIMEOUT_SECONDS,
        )

    async def batched_update(self) -> Measured:
        """The guarded update, 200 ids per statement, one connection, no broker."""
        await db.reset(self.conn)
        await db.insert_due(self.conn, self.holds)
        expired, seconds = await db.batch_expire(
            self.conn, batch_size=BATCH_UPDATE_SIZE, worker="bench-batched-update"
        )
        if expired != self.holds:
            raise RuntimeError(f"batched update expired {expired} of {self.holds}")
        return Measured(expired, seconds, 0.0)
