"""The events' phases (issue 37), as ``--only`` names them; each records its figures and
says a line of progress for each run (``bench.event_runs`` measures):

- ``events``: one consumer's backlog drain with the outbox's trigger off and on (which
  goes first alternates between repetitions), then on with a relay publishing beside
  it; and one relay alone, given a full outbox;
- ``relay``: one relay beside two consumers working off a backlog at full speed, the
  outbox never empty (its rate against theirs);
- ``events-latency``: commit-to-confirm at the sustained rate (``--rate``), two
  consumers, a scanner every second and one relay.
"""

from __future__ import annotations

from bench.config import Options
from bench.event_runs import EventRuns
from bench.measurements import Bench
from bench.recording import Say, consumers_label, machine_line, record_consume, record_machine
from bench.report import Results

RELAY_CONSUMERS = 2  # "one relay keeps up with two consumers at full speed"
CONFIRM_OBJECTIVE_SECONDS = 0.25  # p99 commit to confirm; a bucket bound of the histogram


async def events(bench: Bench, results: Results, say: Say) -> None:
    """Events off and on, on with a relay beside; the relay alone."""
    runs = EventRuns(bench)
    for on in (False, True) if results.repetition % 2 else (True, False):
        label = f"1 consumer, events {'on (outbox written, no relay)' if on else 'off'}"
        run = await runs.backlog(events=on)
        record_consume(results, "events_on" if on else "events_off", label, run, say)
    run = await runs.backlog(events=True, relay=True)
    record_consume(results, "events_relay", "1 consumer, events on, a relay beside", run, say)
    alone = await runs.relay_alone()
    marks = alone.marks
    results.add("relay.alone", "relay alone, a full outbox: events/s", "/s", marks.rate)
    results.add("relay.alone_cpu_us", "  relay CPU per event", "us", alone.cpu_us_per_event)
    say(
        f"  relay alone      {alone.events:,} events in {marks.batches} batches, "
        f"{marks.seconds:.2f}s from the first mark to the last: {marks.rate:,.0f}/s, "
        f"{alone.cpu_us_per_event:,.0f} us CPU/event"
    )


def relays_label(count: int) -> str:
    return "a relay" if count == 1 else f"{count} relays"


async def relay(bench: Bench, results: Results, say: Say) -> None:
    """One relay (``--relays``) beside two consumers at full speed: its rate against theirs."""
    run = await EventRuns(bench).relay_beside(RELAY_CONSUMERS)
    relays = relays_label(bench.options.relays)
    label = f"{consumers_label(RELAY_CONSUMERS)}, events on, {relays} beside (outbox never empty)"
    record_consume(results, "relay_consumers", label, run.consume, say)
    marks = run.marks
    results.add("relay.beside", f"  {relays} beside them: events/s", "/s", marks.rate)
    say(
        f"  relay beside     {marks.events:,} events in {marks.batches} batches over "
        f"{marks.seconds:.2f}s of the consumers' {run.consume.window.seconds:.2f}s: "
        f"{marks.rate:,.0f}/s; {run.prefilled:,} written ahead"
        + (" (all sent before their first expiry: a lower bound)" if run.short_of_work else "")
    )


async def latency(bench: Bench, options: Options, results: Results, say: Say) -> None:
    """Commit to confirm at a sustained rate, from the relay's own histogram."""
    run = await EventRuns(bench).latency()
    consume, lag, confirm, mark = run.consume, run.lag, run.confirm, run.mark
    achieved = lag.expired / lag.seconds if lag.seconds > 0 else 0.0
    label = (
        f"events at a sustained {options.rate:,}/s, "
        f"{consumers_label(consume.consumers)} + {relays_label(options.relays)}: "
        "commit to confirm p50"
    )
    within = confirm.share_within(CONFIRM_OBJECTIVE_SECONDS)
    p50, p99 = confirm.quantile(0.5) * 1000, confirm.quantile(0.99) * 1000
    results.add("events.confirm_p50", label, "ms", p50)
    results.add("events.confirm_p99", "  commit to confirm p99 (the relay's histogram)", "ms", p99)
    results.add("events.within", "  confirmed within 250 ms of the commit", "%", within * 100)
    results.add(
        "events.mark_p50", "  commit to mark p50 (expiry_events_sent)", "ms", mark.p50 * 1e3
    )
    results.add(
        "events.mark_p99", "  commit to mark p99 (expiry_events_sent)", "ms", mark.p99 * 1e3
    )
    batches = run.batches
    per_batch = confirm.count / batches.count if batches.count else 0.0
    batch_ms = batches.sum / batches.count * 1000 if batches.count else 0.0
    results.add(
        "events.batch_ms", "  relay batch, mean (claim, publish, confirms, mark)", "ms", batch_ms
    )
    results.add("events.per_batch", "  relay batch, mean events", "events", per_batch)
    results.add("events.rate", "  expirations/s (first deadline to last expiry)", "/s", achieved)
    results.add("events.lag_p99", "  lag p99 (deadline to expired)", "s", lag.p99)
    share = run.relay_cpu_share * 100
    results.add("events.relay_cpu", "  relay CPU, share of one core (each)", "%", share)
    record_machine(results, "events", consume)
    say(
        f"  events latency   {lag.expired:,} holds due at {options.rate:,}/s: {achieved:,.0f}/s "
        f"expired, lag p99 {lag.p99:.2f}s; commit to confirm (the relay's histogram, "
        f"{confirm.count:,.0f} events) p50 {p50:.0f} ms, p99 {p99:.0f} ms, "
        f"{within:.1%} within 250 ms"
    )
    say(
        f"                   commit to mark (expiry_events_sent, {mark.events:,}): p50 "
        f"{mark.p50 * 1000:.0f} ms, p99 {mark.p99 * 1000:.0f} ms, max {mark.max * 1000:.0f} ms; "
        f"relay: {batches.count:,.0f} batches of {per_batch:,.0f} events, {batch_ms:.0f} ms "
        f"each on average, CPU {run.relay_cpu_share:.0%} of a core; {machine_line(consume)}"
    )
