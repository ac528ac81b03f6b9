"""``python -m bench``: arguments, the sandbox, the run, the report, the exit code."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aio_pika
import asyncpg

from bench import cpu, phases, report
from bench.amqp import Probe
from bench.config import PHASES, Endpoints, Options, endpoints_from
from bench.limits import Limits
from bench.machine import Machine, describe
from bench.measurements import Bench
from bench.procs import Processes
from bench.sandbox import Sandbox, deployed, new_name
from bench.supervisor import Supervisor
from bench.targets import other_ratios, targets
from service.cli import positive
from service.settings import Settings

EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130
FULL = {"holds": 20_000, "repeat": 3, "rate": 2_000, "duration": 20.0, "scan_holds": 100_000}
QUICK = {"holds": 1_000, "repeat": 1, "rate": 500, "duration": 3.0, "scan_holds": 5_000}
METHOD = [
    "  method      end-to-end: N due holds published by the scan first (no consumer running),",
    "              then K consumers started; rate = expired / (last - first transition `at`).",
    "              raw consume + ack: the same N messages in a quorum queue of the work queue's",
    "              arguments, timed from the first delivery to the last ack, in a subprocess.",
    "              lag: transition `at` - hold_until (database clock), holds due at a steady rate.",
    "              CPU: utime + stime of the consumers from attaching to the last expiry.",
]


def say(text: str) -> None:
    """One line of progress or report, on stdout."""
    print(text, flush=True)


def _consumer_counts(text: str) -> tuple[int, ...]:
    try:
        counts = {int(part) for part in text.split(",") if part.strip()}
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of counts: {text!r}") from None
    if not counts or min(counts) < 1 or max(counts) > 16:
        raise argparse.ArgumentTypeError("counts between 1 and 16, e.g. 1,2")
    return tuple(sorted(counts | {1}))  # 1 is the reference of every ratio


def _setting(text: str) -> tuple[str, str]:
    name, equals, value = text.partition("=")
    if not equals or not name.startswith("EXPIRY_") or name == "EXPIRY_WORKER_ID":
        raise argparse.ArgumentTypeError("EXPIRY_NAME=VALUE, e.g. EXPIRY_PREFETCH=500")
    return name, value


def parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description=(
            "Benchmark the expiry service against the local PostgreSQL and RabbitMQ, in a "
            "database and a vhost of its own (removed afterwards): end-to-end expirations/s "
            "with K consumers and with the per-message path, lag at a sustained rate, scan "
            "publish rate and memory, and the raw limits they are compared with."
        ),
    )
    add = p.add_argument
    add("--holds", type=positive(int), help=f"due holds per backlog run ({FULL['holds']:,})")
    add("--repeat", type=positive(int), help=f"repetitions ({FULL['repeat']})")
    add("--consumers", type=_consumer_counts, default=(1, 2), help="consumer processes (1,2)")
    add("--rate", type=positive(int), help=f"sustained: holds due per second ({FULL['rate']:,})")
    add("--duration", type=positive(float), help=f"sustained: seconds ({FULL['duration']:g})")
    add("--scan-holds", type=positive(int), help=f"memory scan ({FULL['scan_holds']:,})")
    add(
        "--env",
        type=_setting,
        action="append",
        default=[],
        metavar="EXPIRY_NAME=VALUE",
        help="a service setting for every scan and consumer (repeatable); default: none",
    )
    add(
        "--relays",
        type=positive(int),
        default=1,
        help="relays beside the consumers in the phases relay and events-latency (1)",
    )
    add("--quick", action="store_true", help="small sizes for a smoke run (one repetition)")
    add(
        "--only",
        type=_phases,
        default=frozenset(),
        metavar="PHASE[,PHASE...]",
        help=f"only these phases (and the raw limits): {', '.join(PHASES)}; default: all",
    )
    add("--json", type=Path, metavar="FILE", help="write the figures to FILE")
    add("--markdown", type=Path, metavar="FILE", help="write the tables as Markdown to FILE")
    add("--keep-logs", action="store_true", help="keep the processes' logs")
    return p


def _phases(text: str) -> frozenset[str]:
    names = frozenset(name.strip() for name in text.split(",") if name.strip())
    unknown = sorted(names - set(PHASES))
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown phase {', '.join(unknown) or '(none)'}: one of {', '.join(PHASES)}"
        )
    return names


def options_from(args: argparse.Namespace) -> Options:
    """The sizes: the command line, else the --quick or full defaults."""
    base = QUICK if args.quick else FULL

    def pick(name: str) -> Any:
        value = getattr(args, name)
        return base[name] if value is None else value

    return Options(
        holds=pick("holds"),
        repeat=pick("repeat"),
        consumers=args.consumers,
        rate=pick("rate"),
        duration=pick("duration"),
        scan_holds=pick("scan_holds"),
        scan_every=1.0,
        quick=args.quick,
        json_path=args.json,
        overrides=tuple(args.env),
        only=tuple(sorted(args.only)),
        relays=args.relays,
    )


def consumer_defaults() -> str:
    """The consumer settings the service ships with (what the batched runs use)."""
    fields = Settings.model_fields
    parts = [
        f"EXPIRY_PREFETCH={fields['prefetch'].default}",
        f"EXPIRY_DB_POOL_SIZE={fields['db_pool_size'].default}",
    ]
    for name in ("batch_size", "batch_wait_ms"):
        if name in fields:
            parts.append(f"EXPIRY_{name.upper()}={fields[name].default}")
    if "batch_size" not in fields:
        parts.append("no EXPIRY_BATCH_SIZE in this version (both paths are per-message)")
    parts.append(f"EXPIRY_LOG_LEVEL={fields['log_level'].default}")
    return ", ".join(parts)


def introduce(options: Options, sandbox: Sandbox, machine: Machine, logs: Path) -> None:
    say(
        f"expiry-service benchmark: {options.holds:,} holds, {options.repeat} repetition(s), "
        f"consumers {','.join(map(str, options.consumers))}"
        + (" (--quick)" if options.quick else "")
    )
    for line in machine.lines():
        say(line)
    say(f"  consumer    service defaults: {consumer_defaults()}")
    if options.relays > 1:
        say(f"  relays      {options.relays} in the phases relay and events-latency")
    if options.overrides:
        say(f"  overrides   {', '.join(f'{k}={v}' for k, v in options.overrides)}")
    say(f"  sandbox     database and vhost {sandbox.database}; logs {logs}")
    for line in METHOD:
        say(line)


def conclude(options: Options, results: report.Results) -> list[report.Check]:
    checks = targets(results, options)
    say(f"\nresults (min / median / max over {options.repeat} repetition(s))")
    for line in report.figure_table(results):
        say(line)
    say("\ntargets (ratios within each repetition: median, then min-max; values: medians)")
    for line in report.check_table(checks):
        say(line)
    say("\nother ratios (within each repetition: median, then min-max)")
    for what, value in other_ratios(results):
        say(f"  {what:<54} {value}")
    return checks


def write_outputs(
    options: Options,
    args: argparse.Namespace,
    machine: Machine,
    results: report.Results,
    checks: list[report.Check],
) -> None:
    if options.json_path is not None:
        document = {
            "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(options).items()},
            "machine": machine.as_json(),
            "figures": results.as_json(),
            "targets": [vars(check) for check in checks],
        }
        options.json_path.write_text(json.dumps(document, indent=2) + "\n")
    if args.markdown is not None:
        lines = [
            *(f"- {line.strip()}" for line in machine.lines()),
            "",
            *report.markdown_table(results),
            "",
            *report.markdown_checks(checks),
        ]
        args.markdown.write_text("\n".join(lines) + "\n")


def local_servers(sandbox: Sandbox) -> cpu.Servers:
    """The local PostgreSQL and RabbitMQ processes behind the sandbox's ports (if local)."""
    database_port = urlsplit(sandbox.database_url).port or 5432
    amqp_port = urlsplit(sandbox.amqp_url).port or 5672
    return cpu.find_servers(database_port, amqp_port, sandbox.database)


async def measured(
    options: Options, endpoints: Endpoints, name: str, logs: Path
) -> tuple[Machine, report.Results]:
    """Create the sandbox, migrate it and declare its topology (as a deploy does), measure;
    stop every process and remove the sandbox."""
    async with deployed(endpoints, name, logs, say, options.overrides) as (sandbox, procs):
        return await _measure(options, sandbox, procs, logs)


async def _measure(
    options: Options, sandbox: Sandbox, procs: Processes, logs: Path
) -> tuple[Machine, report.Results]:
    conn = await asyncpg.connect(sandbox.database_url)
    connection = await aio_pika.connect(sandbox.amqp_url)
    try:
        machine = await describe(conn, sandbox.management)
        introduce(options, sandbox, machine, logs)
        probe = Probe(connection)
        supervisor = Supervisor(procs, probe, conn, options)
        limits = Limits(supervisor, probe, conn, sandbox.amqp_url, options.holds)
        servers = local_servers(sandbox)
        bench = Bench(options, conn, probe, supervisor, servers, sandbox.database_url)
        return machine, await phases.measure(limits, bench, options, say)
    finally:
        await connection.close()
        await conn.close()


async def benchmark(args: argparse.Namespace) -> int:
    """Measure, report; the logs are kept when something failed (or with --keep-logs)."""
    options = options_from(args)
    name = new_name()
    logs = Path(tempfile.mkdtemp(prefix=f"{name}-logs-"))
    try:
        machine, results = await measured(options, endpoints_from(os.environ), name, logs)
    except BaseException:
        say(f"the processes' logs are kept in {logs}")
        raise
    checks = conclude(options, results)
    write_outputs(options, args, machine, results, checks)
    if args.keep_logs:
        say(f"the processes' logs are kept in {logs}")
    else:
        shutil.rmtree(logs, ignore_errors=True)
    return 0


async def _main(args: argparse.Namespace) -> int:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await benchmark(args)


def main() -> None:
    """Entry point: exit 0 after a complete run (whether or not the targets are met)."""
    args = parser().parse_args()
    try:
        code = asyncio.run(_main(args))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("python -m bench: interrupted", file=sys.stderr)
        code = EXIT_INTERRUPTED
    except Exception as exc:
        print(f"python -m bench: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = EXIT_FAILURE
    sys.exit(code)
