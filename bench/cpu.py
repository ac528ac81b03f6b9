"""Where the machine's CPU went during a measurement: the whole machine, PostgreSQL, RabbitMQ.

Read from ``/proc``: the first line of ``/proc/stat`` for the machine, and the
utime + stime of every process named ``postgres`` (server and backends) or
``beam.smp`` (the Erlang VM of RabbitMQ). Processes that start or exit between
two snapshots count only for the part both snapshots saw.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
GROUPS = {"postgres": "postgresql", "beam.smp": "rabbitmq"}


@dataclass(frozen=True)
class Snapshot:
    """Cumulative CPU ticks at one moment."""

    at: float
    busy: int  # the machine: every state but idle and iowait
    total: int
    processes: dict[int, tuple[str, int]] = field(default_factory=dict)  # pid -> (group, ticks)


@dataclass(frozen=True)
class Shares:
    """CPU between two snapshots: the machine's busy share, and cores used per group."""

    seconds: float
    machine_busy: float  # 0..1 of all cores
    cores: dict[str, float]  # group -> cores (1.0 = one core fully busy)


def _machine() -> tuple[int, int]:
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])  # guest time is already counted in user
    return total - idle, total


def _process(pid: str) -> tuple[str, int] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    group = GROUPS.get(comm)
    if group is None:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return group, int(fields[11]) + int(fields[12])


def snapshot() -> Snapshot:
    """The machine's and the servers' CPU ticks now."""
    processes: dict[int, tuple[str, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (found := _process(entry)) is not None:
            processes[int(entry)] = found
    busy, total = _machine()
    return Snapshot(time.monotonic(), busy, total, processes)


def shares(before: Snapshot, after: Snapshot) -> Shares:
    """CPU used between two snapshots."""
    seconds = after.at - before.at
    cores = dict.fromkeys(GROUPS.values(), 0.0)
    for pid, (group, ticks) in after.processes.items():
        start = before.processes.get(pid, (group, ticks))[1]
        cores[group] += (ticks - start) / CLOCK_TICKS / seconds if seconds > 0 else 0.0
    total = after.total - before.total
    busy = (after.busy - before.busy) / total if total > 0 else 0.0
    return Shares(seconds, busy, cores)
