"""Where the machine's CPU went during a measurement: the whole machine, PostgreSQL, RabbitMQ.

Read from ``/proc``: the first line of ``/proc/stat`` for the machine, and the
utime + stime of the servers the benchmark talks to: the PostgreSQL postmaster
listening on the database's port, its backends connected to the benchmark's
database and its WAL writer, checkpointer and background writer (not the
backends of other databases), and the Erlang VM (``beam.smp``) listening on
the AMQP port (the whole node: other vhosts' work counts too). Other clusters
and nodes on the same machine do not count. A server that is not local (or
whose sockets cannot be read) is left out. Processes that start or exit between two
snapshots count only for the part both snapshots saw.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
LISTEN = "0A"
POSTGRES_SHARED = ("checkpointer", "background writer", "walwriter")


@dataclass(frozen=True)
class Servers:
    """The servers' local processes: group -> (pid, the children that count, by command line).

    A child counts when its command line (the process title) contains one of the
    strings; with none, no child counts.
    """

    roots: dict[str, tuple[int, tuple[str, ...]]]


@dataclass(frozen=True)
class Snapshot:
    """Cumulative CPU ticks at one moment."""

    at: float
    busy: int  # the machine: every state but idle and iowait
    total: int
    processes: dict[int, tuple[str, int]] = field(default_factory=dict)  # pid -> (group, ticks)


@dataclass(frozen=True)
class Shares:
    """CPU between two snapshots: the machine's busy share, and cores used per server."""

    seconds: float
    machine_busy: float  # 0..1 of all cores
    cores: dict[str, float]  # group -> cores (1.0 = one core fully busy); local servers only


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == LISTEN:
                    inodes.add(fields[9])
    return inodes


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(comm, ppid, utime + stime ticks) of a process, or ``None`` if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    return comm, int(fields[1]), int(fields[11]) + int(fields[12])


def _pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def listener(port: int, comm: str) -> int | None:
    """The pid of the process called ``comm`` that listens on TCP ``port``, if readable."""
    sockets = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    for pid in _pids():
        found = _stat(pid)
        if not sockets or found is None or found[0] != comm:
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") in sockets:
                    return pid
    return None


def find_servers(database_port: int, amqp_port: int, database: str) -> Servers:
    """The local PostgreSQL (``database``'s backends) and RabbitMQ processes on these ports."""
    roots: dict[str, tuple[int, tuple[str, ...]]] = {}
    if (postmaster := listener(database_port, "postgres")) is not None:
        roots["postgresql"] = (postmaster, (f" {database} ", *POSTGRES_SHARED))
    if (beam := listener(amqp_port, "beam.smp")) is not None:
        roots["rabbitmq"] = (beam, ())
    return Servers(roots)


def _counts(pid: int, markers: tuple[str, ...]) -> bool:
    if not markers:
        return False
    try:
        title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (OSError, UnicodeDecodeError):
        return False
    return any(marker in f"{title} " for marker in markers)


def _machine() -> tuple[int, int]:
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])  # guest time is already counted in user
    return total - idle, total


def snapshot(servers: Servers) -> Snapshot:
    """The machine's and the servers' CPU ticks now."""
    groups = {pid: (group, children) for group, (pid, children) in servers.roots.items()}
    processes: dict[int, tuple[str, int]] = {}
    for pid in _pids() if groups else []:
        found = _stat(pid)
        if found is None:
            continue
        _, ppid, ticks = found
        if pid in groups:
            processes[pid] = (groups[pid][0], ticks)
        elif ppid in groups and _counts(pid, groups[ppid][1]):
            processes[pid] = (groups[ppid][0], ticks)
    busy, total = _machine()
    return Snapshot(time.monotonic(), busy, total, processes)


def shares(servers: Servers, before: Snapshot, after: Snapshot) -> Shares:
    """CPU used between two snapshots."""
    seconds = after.at - before.at
    cores = dict.fromkeys(servers.roots, 0.0)
    for pid, (group, ticks) in after.processes.items():
        start = before.processes.get(pid, (group, ticks))[1]
        cores[group] += (ticks - start) / CLOCK_TICKS / seconds if seconds > 0 else 0.0
    total = after.total - before.total
    busy = (after.busy - before.busy) / total if total > 0 else 0.0
    return Shares(seconds, busy, cores)
