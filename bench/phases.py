"""The phases of one benchmark run (what ``--only`` names), repeated: each runs its
measurements and records their figures, with a line of progress for each."""

from __future__ import annotations

import importlib.util
from collections.abc import Awaitable, Callable, Mapping

from bench import event_phases, pooler_phases, webhook_phases
from bench.config import Options
from bench.limits import Limits
from bench.measurements import Bench
from bench.recording import (
    Say,
    consumers_label,
    free_port,
    machine_line,
    record_consume,
    record_machine,
    record_scan,
)
from bench.report import Results

PER_MESSAGE_ENV = {"EXPIRY_BATCH_SIZE": "1"}


async def raw_limits(limits: Limits, results: Results, say: Say) -> None:
    """The raw limits: the broker with no database, the database with no broker."""
    raw = await limits.raw()
    per_message = raw.consume.cpu_seconds / raw.consume.count * 1e6 if raw.consume.count else 0
    results.add("raw.publish", "raw publish with confirms (window 500)", "/s", raw.publish.rate)
    results.add(
        "raw.consume", "raw consume + ack (prefetch 1000, multiple/100)", "/s", raw.consume.rate
    )
    results.add("raw.cpu_us", "  raw consumer CPU per message", "us", per_message)
    results.add("raw.rss", "  raw consumer peak RSS", "MB", raw.consume_usage.peak_rss_mb)
    say(
        f"  raw publish      {raw.publish.count:,} with confirms in {raw.publish.seconds:.2f}s: "
        f"{raw.publish.rate:,.0f}/s"
    )
    say(
        f"  raw consume+ack  {raw.consume.count:,} in {raw.consume.seconds:.2f}s: "
        f"{raw.consume.rate:,.0f}/s, {per_message:,.0f} us CPU/message"
    )
    update = await limits.batched_update()
    results.add("db.batched", "batched guarded update, 200/statement, no broker", "/s", update.rate)
    say(
        f"  batched update   {update.count:,} in {update.seconds:.2f}s: {update.rate:,.0f}/s "
        "(200 ids per statement, one connection)"
    )


async def service_runs(bench: Bench, options: Options, results: Results, say: Say) -> None:
    """The real commands: batched consumers (each K), one with its /metrics on, the
    per-message path, the peer, tracing, locked rows, the sustained run and the capacity
    searches (those ``--only`` names, if given)."""
    phases: dict[str, Callable[[], Awaitable[None]]] = {
        "backlog": lambda: backlogs(bench, options, results, say),
        "metrics": lambda: one_backlog(
            bench, results, say, "metrics", "1 consumer, /metrics on", metrics_env()
        ),
        "per-message": lambda: one_backlog(
            bench, results, say, "per_message", "1 consumer, EXPIRY_BATCH_SIZE=1", PER_MESSAGE_ENV
        ),
        "peer": lambda: peer(bench, results, say),
        "traced": lambda: traced(bench, results, say),
        "production": lambda: production(bench, results, say),
        "locked": lambda: locked_rows(bench, options, results, say),
        "sustained": lambda: sustained(bench, options, results, say),
        "capacity": lambda: capacity(bench, options, results, say),
        "scanners": lambda: capacity(bench, options, results, say, scanners=2),
        "events": lambda: event_phases.events(bench, results, say),
        "relay": lambda: event_phases.relay(bench, results, say),
        "events-latency": lambda: event_phases.latency(bench, options, results, say),
        "webhooks": lambda: webhook_phases.webhooks(bench, results, say),
        "pooler": lambda: pooler_phases.pooler(bench, results, say),
    }
    for phase, run in phases.items():
        if options.runs(phase):
            await run()


async def backlogs(bench: Bench, options: Options, results: Results, say: Say) -> None:
    """The backlog drain with the shipped settings, for each number of consumers."""
    for count in options.consumers:
        env: dict[str, str] = {}
        await one_backlog(
            bench, results, say, f"k{count}", f"{consumers_label(count)} (default)", env, count
        )


async def one_backlog(
    bench: Bench,
    results: Results,
    say: Say,
    key: str,
    label: str,
    env: Mapping[str, str],
    consumers: int = 1,
) -> None:
    """One backlog drain: the scan, then ``consumers`` consumers with ``env``."""
    scan, run = await bench.backlog(consumers, env)
    record_scan(results, scan, say)
    record_consume(results, key, label, run, say)


def metrics_env() -> dict[str, str]:
    """A consumer serving /metrics (the Prometheus reader and the instruments on), as an
    operator who alerts on it runs it."""
    return {"EXPIRY_HTTP_PORT": str(free_port())}


LAG_OBJECTIVE_SECONDS = 1.0  # plus the scan interval
MAX_DOUBLINGS = 3  # the capacity search goes up to 8x the raw publish rate


async def capacity(
    bench: Bench, options: Options, results: Results, say: Say, scanners: int = 1
) -> None:
    """The highest steady rate of due holds at which the p99 lag (deadline to expired)
    stays within the scan interval + 1 s. The first probe is this repetition's raw
    publish rate; while a probe keeps within the objective the next doubles it (at
    most ``MAX_DOUBLINGS`` times), then bisection between the last rate within and the
    first over (5 probes, 3 with --quick); each probe's holds come due over half the
    sustained run's duration."""
    ceiling = round(results.figures["raw.publish"].by_repetition()[results.repetition])
    objective = options.scan_every + LAG_OBJECTIVE_SECONDS

    async def within(rate: int) -> bool:
        run = await bench.sustained(rate, options.duration / 2, scanners)
        ok = run.lag.p99 <= objective
        say(
            f"  capacity probe   {rate:,}/s for {options.duration / 2:g}s: lag p99 "
            f"{run.lag.p99:.2f}s, {'within' if ok else 'over'} {objective:g}s"
        )
        return ok

    low, high = 0, max(1, ceiling)
    for _ in range(MAX_DOUBLINGS):
        if not await within(high):
            break
        low, high = high, high * 2
    else:
        low, high = high, high  # within even there: the search stops at this rate
    for _ in range(3 if options.quick else 5):
        if high - low <= 1:
            break
        rate = (low + high) // 2
        low, high = (rate, high) if await within(rate) else (low, rate)
    label = f"capacity at lag p99 <= {objective:g}s, {consumers_label(options.sustained_consumers)}"
    scanning = f"{scanners} scanner{'s' if scanners > 1 else ''}"
    key = "capacity.rate" if scanners == 1 else f"capacity.scanners{scanners}"
    results.add(key, f"{label} + {scanning}", "/s", low)
    say(f"  capacity         {low:,}/s ({label} and {scanning} every {options.scan_every:g}s)")


async def peer(bench: Bench, results: Results, say: Say) -> None:
    """Dramatiq, its default worker, doing the same job on the same servers (if installed)."""
    if importlib.util.find_spec("dramatiq") is None or importlib.util.find_spec("psycopg") is None:
        say("  peer             Dramatiq: not installed (pip install '.[peer]'): skipped")
        return
    run = await bench.peer()
    label = "end-to-end expirations/s, Dramatiq peer (default worker)"
    results.add("e2e.peer", label, "/s", run.window.rate)
    per_expiry = run.cpu_us_per_expiry
    results.add("cpu_us.peer", "  peer CPU per expiry (all its processes)", "us", per_expiry)
    say(
        f"  peer             Dramatiq (its default worker: a process per core x 8 threads, a "
        f"guarded UPDATE per message): {run.window.expired:,} in {run.window.seconds:.2f}s: "
        f"{run.window.rate:,.0f}/s, {run.cpu_us_per_expiry:,.0f} us/expiry; {machine_line(run)}"
    )


TRACE_RATIOS = {"trace100": 1.0, "trace10": 0.1}
PRODUCTION_RATIO = 0.1  # compose.yaml's OTEL_TRACES_SAMPLER_ARG


async def traced(bench: Bench, results: Results, say: Say) -> None:
    """1 consumer tracing (OTLP to a sink that discards), 100% and 10% of jobs sampled by
    the scan (the consumer follows its decision)."""
    for key, sampled in TRACE_RATIOS.items():
        await one_traced(
            bench, results, say, key, f"1 consumer, tracing {sampled:.0%} sampled", sampled
        )


async def production(bench: Bench, results: Results, say: Say) -> None:
    """1 consumer as compose.yaml runs it: /metrics on and 10% of jobs traced."""
    label = f"1 consumer, production profile (/metrics + tracing {PRODUCTION_RATIO:.0%})"
    await one_traced(bench, results, say, "production", label, PRODUCTION_RATIO, metrics_env())


async def one_traced(
    bench: Bench,
    results: Results,
    say: Say,
    key: str,
    label: str,
    sampled: float,
    env: Mapping[str, str] | None = None,
) -> None:
    run, spans = await bench.traced(sampled, env)
    record_consume(results, key, label, run, say)
    results.add(f"spans.{key}", "  spans exported, scan and consumer (to a sink)", "spans", spans)
    say(f"                   {spans:,} spans exported (scan and consumer)")


LOCKED_SHARE = 0.05
LOCKED_ENV = {"EXPIRY_LOCK_TIMEOUT_MS": "1000"}


async def locked_rows(bench: Bench, options: Options, results: Results, say: Say) -> None:
    """1 consumer on the backlog while 5% of its rows are locked by another transaction."""
    held = 2.0 if options.quick else 4.0
    run = await bench.locked_rows(LOCKED_SHARE, held, LOCKED_ENV)
    free = run.free
    label = f"1 consumer, {LOCKED_SHARE:.0%} of rows locked for {held:g}s"
    results.add("locked.rate", f"{label}: the others' expirations/s", "/s", free.rate)
    results.add(
        "locked.at_release",
        "  the others expired when the locks went",
        "holds",
        run.expired_at_release,
    )
    results.add(
        "locked.after",
        "  the locked ones all expired, after the release",
        "s",
        run.locked_done_seconds,
    )
    say(
        f"  locked rows      {label} (EXPIRY_LOCK_TIMEOUT_MS=1000): the other "
        f"{run.holds - run.locked:,} expired at {free.rate:,.0f}/s, "
        f"{run.expired_at_release:,} of them before the release; the {run.locked:,} locked "
        f"ones {run.locked_done_seconds:.1f}s after it"
    )


async def sustained(bench: Bench, options: Options, results: Results, say: Say) -> None:
    """Holds due at a steady rate; lag from deadline to expired."""
    run = await bench.sustained()
    lag, consume = run.lag, run.consume
    achieved = lag.expired / lag.seconds if lag.seconds > 0 else 0.0
    label = f"sustained {options.rate:,}/s, {consumers_label(consume.consumers)}"
    results.add("lag.p50", f"{label}: lag p50", "s", lag.p50)
    results.add("lag.p99", "  lag p99 (deadline to expired)", "s", lag.p99)
    results.add("lag.max", "  lag max", "s", lag.max)
    results.add("sustained.rate", "  expirations/s (first deadline to last expiry)", "/s", achieved)
    results.add("sustained.cpu", "  consumer CPU, share of one core", "%", consume.cpu_share * 100)
    results.add("sustained.rss", "  consumer peak RSS", "MB", consume.peak_rss_mb)
    results.add("sustained.scan", "  scan publish rate while consumers run", "/s", run.scan_rate)
    record_machine(results, "sustained", consume)
    say(
        f"  sustained        {lag.expired:,} holds due at {options.rate:,}/s over "
        f"{options.duration:g}s, scan every {options.scan_every:g}s: lag p50 {lag.p50:.2f}s, "
        f"p99 {lag.p99:.2f}s, max {lag.max:.2f}s; {achieved:,.0f}/s, "
        f"CPU {consume.cpu_share:.0%} of a core per consumer"
    )
    say(
        f"                   scan: {run.scan_passes} passes published {run.scan_published:,} "
        f"at {run.scan_rate:,.0f}/s; {machine_line(consume)}"
    )


async def scan_memory(bench: Bench, options: Options, results: Results, say: Say) -> None:
    """One scan of many due holds: its peak RSS."""
    scan = await bench.scan(options.scan_holds)
    await bench.probe.purge("expirations")
    label = f"scan of {options.scan_holds:,} due holds"
    results.add("scan_memory.rss", f"{label}: peak RSS", "MB", scan.usage.peak_rss_mb)
    results.add("scan_memory.rate", "  publish rate", "/s", scan.rate)
    say(
        f"  {label}: {scan.seconds:.2f}s, {scan.rate:,.0f}/s, "
        f"peak RSS {scan.usage.peak_rss_mb:.0f} MB"
    )


async def measure(limits: Limits, bench: Bench, options: Options, say: Say) -> Results:
    """Every repetition, then the scan's memory run."""
    results = Results()
    for number in range(1, options.repeat + 1):
        results.repetition = number
        say(f"\nrepetition {number}/{options.repeat}")
        await raw_limits(limits, results, say)
        await service_runs(bench, options, results, say)
    results.repetition = 0  # once, after the repetitions
    if options.runs("scan-memory"):
        say("\nscan memory")
        await scan_memory(bench, options, results, say)
    return results
