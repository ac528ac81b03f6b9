"""How a phase records what it measured: each figure in the results, and a line of
progress for each run (shared by ``bench.phases`` and ``bench.event_phases``)."""

from __future__ import annotations

import socket
from collections.abc import Callable

from bench.measurements import ConsumeRun, ScanRun
from bench.report import Results

Say = Callable[[str], None]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a consumer's metrics endpoint)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def consumers_label(count: int) -> str:
    return f"{count} consumer{'s' if count > 1 else ''}"


def record_scan(results: Results, scan: ScanRun, say: Say) -> None:
    results.add("scan.rate", "scan publish rate (produce --scan)", "/s", scan.rate)
    results.add("scan.rss", "  scan peak RSS", "MB", scan.usage.peak_rss_mb)
    say(
        f"  scan             {scan.published:,} due holds in {scan.seconds:.2f}s: "
        f"{scan.rate:,.0f}/s, peak RSS {scan.usage.peak_rss_mb:.0f} MB"
    )


def record_consume(results: Results, key: str, label: str, run: ConsumeRun, say: Say) -> None:
    results.add(f"e2e.{key}", f"end-to-end expirations/s, {label}", "/s", run.window.rate)
    results.add(f"cpu.{key}", "  consumer CPU, share of one core", "%", run.cpu_share * 100)
    results.add(f"cpu_us.{key}", "  consumer CPU per expiry", "us", run.cpu_us_per_expiry)
    results.add(f"rss.{key}", "  consumer peak RSS", "MB", run.peak_rss_mb)
    record_machine(results, key, run)
    say(
        f"  consume          {label}: {run.window.expired:,} in {run.window.seconds:.2f}s: "
        f"{run.window.rate:,.0f}/s, CPU {run.cpu_share:.0%} of a core per process, "
        f"{run.cpu_us_per_expiry:,.0f} us/expiry, peak RSS {run.peak_rss_mb:.0f} MB"
        + (f", first expiries {run.start_spread:.2f}s apart" if run.consumers > 1 else "")
    )
    say(f"                   {machine_line(run)}")


SERVERS = {"postgresql": ("pg", "PostgreSQL"), "rabbitmq": ("rmq", "RabbitMQ node")}


def record_machine(results: Results, key: str, run: ConsumeRun) -> None:
    shares = run.machine
    results.add(f"machine.{key}", "  machine CPU busy, all cores", "%", shares.machine_busy * 100)
    for group, cores in shares.cores.items():
        prefix, name = SERVERS[group]
        results.add(f"{prefix}.{key}", f"  {name} CPU, cores", "cores", cores)


def machine_line(run: ConsumeRun) -> str:
    shares = run.machine
    servers = "".join(
        f"{SERVERS[group][1]} {cores:.2f} cores, " for group, cores in shares.cores.items()
    )
    return (
        f"machine CPU {shares.machine_busy:.0%} busy: {servers}"
        f"consumers {run.cpu_seconds / shares.seconds:.2f} cores"
    )
