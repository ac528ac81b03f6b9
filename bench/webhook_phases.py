"""The webhooks' phase (issue 38), as ``--only webhooks`` names it; it records its figures
and says a line of progress for each run (``bench.webhook_runs`` measures):

- deliveries/s to a local endpoint (``bench.receiver``, a process of its own) with one
  deliverer and with two, given a backlog of N deliveries (``--holds``), the endpoint's
  rate limit effectively off;
- one consumer's backlog drain with events on and one endpoint registered (each expiry
  writes its event and that event's delivery; no deliverer runs) and with events on and
  none registered (the event only): which goes first alternates between repetitions, as
  the ``events`` phase alternates off and on.
"""

from __future__ import annotations

from bench.event_runs import EventRuns
from bench.measurements import Bench
from bench.recording import Say, record_consume
from bench.report import Results
from bench.webhook_runs import ENDPOINT, RATE_OFF, DeliverRun, WebhookRuns
from service.settings import Settings

DELIVERERS = (1, 2)
ONE_ENDPOINT = ("webhooks_one", "1 consumer, events on, one endpoint registered (no deliverer)")
NO_ENDPOINT = ("webhooks_none", "1 consumer, events on, no endpoint registered")


def deliverers_label(count: int) -> str:
    return f"{count} deliverer{'s' if count > 1 else ''}"


def concurrency(bench: Bench) -> str:
    """Requests in flight per deliverer: ``--env``'s, else the shipped default."""
    default = Settings.model_fields["webhook_concurrency"].default
    return dict(bench.options.overrides).get("EXPIRY_WEBHOOK_CONCURRENCY", str(default))


def this_repetition(results: Results, top: str, bottom: str) -> float | None:
    """``top / bottom`` in the current repetition (None if either is missing or 0)."""
    figures, repetition = results.figures, results.repetition
    if top not in figures or bottom not in figures:
        return None
    a, b = figures[top].by_repetition(), figures[bottom].by_repetition()
    if repetition not in a or not b.get(repetition):
        return None
    return a[repetition] / b[repetition]


def record_delivery(results: Results, run: DeliverRun, say: Say) -> None:
    """One backlog of deliveries: the rate, the deliverers' CPU, the receiver's, the servers'."""
    key, received = f"k{run.deliverers}", run.received
    label = f"webhooks: deliveries/s, {deliverers_label(run.deliverers)}, a local endpoint"
    results.add(f"webhooks.{key}", label, "/s", received.rate)
    share, per_delivery = run.cpu_share * 100, run.cpu_us_per_delivery
    results.add(f"webhooks.cpu_{key}", "  deliverer CPU, share of one core", "%", share)
    results.add(f"webhooks.cpu_us_{key}", "  deliverer CPU per delivery", "us", per_delivery)
    results.add(f"webhooks.receiver_{key}", "  receiver CPU, cores", "cores", run.receiver_cores)
    per_1000 = run.attempt_bytes_per_1000
    label = "  webhook_attempts on disk per 1,000 deliveries"
    results.add(f"webhooks.attempt_bytes_{key}", label, "B", per_1000)
    shares = run.machine
    busy = shares.machine_busy * 100
    results.add(f"machine.webhooks_{key}", "  machine CPU busy, all cores", "%", busy)
    postgres = shares.cores.get("postgresql")
    if postgres is not None:  # only when the server is local
        results.add(f"pg.webhooks_{key}", "  PostgreSQL CPU, cores", "cores", postgres)
    say(
        f"  webhooks         {deliverers_label(run.deliverers)}: {run.deliveries:,} deliveries "
        f"in {received.seconds:.2f}s (first to last request): {received.rate:,.0f}/s, "
        f"CPU {run.cpu_share:.0%} of a core per deliverer, {run.cpu_us_per_delivery:,.0f} "
        f"us/delivery; {received.repeats:,} delivered again"
    )
    say(
        f"                   kept: webhook_attempts {run.kept.attempts:,} rows, "
        f"{per_1000:,.0f} B per 1,000 deliveries (dropped a week at a time past "
        f"EXPIRY_RETENTION_DAYS); webhook_deliveries {run.kept.deliveries:,} rows left"
    )
    say(
        f"                   machine CPU {shares.machine_busy:.0%} busy: "
        + (f"PostgreSQL {postgres:.2f} cores, " if postgres is not None else "")
        + f"receiver {run.receiver_cores:.2f} cores, deliverers "
        f"{run.cpu_seconds / shares.seconds if shares.seconds else 0:.2f} cores"
    )


async def webhooks(bench: Bench, results: Results, say: Say) -> None:
    """Deliveries/s with one and two deliverers; the cost of a delivery row on the expiry
    rate of one consumer (one endpoint registered vs none, events on)."""
    runs = WebhookRuns(bench)
    say(
        f"  webhooks         endpoint rate limit {RATE_OFF:,.0f}/s (effectively off), "
        f"EXPIRY_WEBHOOK_CONCURRENCY={concurrency(bench)} per deliverer, "
        "receiver bench.receiver (its own process)"
    )
    for count in DELIVERERS:
        record_delivery(results, await runs.deliver(count), say)
    two = this_repetition(results, "webhooks.k2", "webhooks.k1")
    if two is not None:
        say(f"                   2 deliverers vs 1: {two:.0%}")
    events = EventRuns(bench)
    for registered in (False, True) if results.repetition % 2 else (True, False):
        key, label = ONE_ENDPOINT if registered else NO_ENDPOINT
        run = await events.backlog(events=True, endpoints=(ENDPOINT,) if registered else ())
        record_consume(results, key, label, run, say)
    cost = this_repetition(results, f"e2e.{ONE_ENDPOINT[0]}", f"e2e.{NO_ENDPOINT[0]}")
    if cost is not None:
        say(f"  webhooks cost    1 consumer, one endpoint registered vs none: {cost:.0%}")
