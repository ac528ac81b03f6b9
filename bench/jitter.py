"""``python -m bench.jitter``: when do commands that failed together come back?

In a vhost of its own (removed afterwards), the topology is declared for one
backoff tier of ``--delay`` seconds with ``--jitter`` over ``--slots`` slot
queues; ``--count`` commands are published to ``expirations`` and taken by a
consumer, and then all fail at once through the consumer's own failure
handling (``Failures``: the retry decision, with its random draw, and the
confirmed publish to the chosen slot's routing key). Each copy's return to
``expirations`` is timed from its confirmed publish (when it entered its
delay queue) and from the instant they failed. It prints a histogram of the
waits over the jitter window, their percentiles, the slots chosen and how many
waited past the tier's bound; then the same with jitter 0 for comparison.
Figures, not a test: nothing fails on a slow day.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractIncomingMessage
from aiormq.exceptions import AMQPError
from pydantic import ValidationError

from bench.config import DEFAULT_AMQP_URL
from service.adapters import amqp
from service.adapters.amqp.declaring import declare_topology, topology_for
from service.adapters.amqp.management import Management, ManagementUnavailable, url_beside
from service.adapters.amqp.messages import command_for
from service.adapters.amqp.vhosts import amqp_user, vhost_created, with_vhost
from service.adapters.telemetry.metrics import Metrics
from service.cli import positive, within
from service.core.redaction import redact
from service.core.topology import (
    DEAD_EXCHANGE,
    EXCHANGE,
    QUEUE,
    RETRY_EXCHANGE,
    ROUTING_KEY,
    delay_label,
    slot_delays_ms,
)
from service.settings import MAX_JITTER_SLOTS, MIN_JITTER_SLOTS, Settings
from service.worker.acks import AckAlone
from service.worker.delivery import Delivery
from service.worker.failures import Failures
from service.worker.ports import AmqpPublisher
from service.worker.reporting import Reporter

BUCKETS = 10
BAR_WIDTH = 40
PERCENTILES = (("min", 0.0), ("p10", 0.1), ("p50", 0.5), ("p90", 0.9), ("max", 1.0))
CONFIRM_TIMEOUT_SECONDS = 30.0
GRACE_SECONDS = 30.0  # after the bound, how long to wait for stragglers


def say(text: str = "") -> None:
    """One line of the report, on stdout."""
    print(text, flush=True)


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError("must be >= 0 and < 1")
    return value


def parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(
        prog="python -m bench.jitter",
        description=(
            "Make COUNT commands fail at the same instant through the consumer's retry path "
            "and time their return from the delay queues, with jitter and without, in a "
            "vhost of its own (removed afterwards)."
        ),
    )
    add = p.add_argument
    add("--amqp-url", default=None, help="RabbitMQ (default: AMQP_URL, else the local one)")
    add("--management-url", default=None, help="its management API (default: beside it, 15672)")
    add("--count", type=positive(int), default=1000, help="commands that fail together (1000)")
    add("--delay", type=positive(int), default=5, help="the tier's delay, its bound (5 s)")
    add("--jitter", type=_fraction, default=0.5, help="fraction of the delay to spread over (0.5)")
    add(
        "--slots",
        type=within(int, MIN_JITTER_SLOTS, MAX_JITTER_SLOTS, "a whole number"),
        default=8,
        help="slot queues of the tier (8)",
    )
    add("--slack", type=positive(float), default=1.0, help="the broker's timer slack allowed (1 s)")
    return p


class TimedPublisher(AmqpPublisher):
    """The consumer's publisher, noting when each retry copy was confirmed and where it went
    (the wait in the delay queue is timed from that confirm)."""

    def __init__(
        self, retry_exchange: AbstractExchange, dead_exchange: AbstractExchange, timeout: float
    ) -> None:
        super().__init__(retry_exchange, dead_exchange, timeout)
        self.confirmed: dict[str, tuple[int, float]] = {}

    async def retry(self, message: aio_pika.Message, delay_ms: int) -> None:
        await super().retry(message, delay_ms)
        self.confirmed[message.message_id or ""] = (delay_ms, time.monotonic())


@dataclass(frozen=True)
class Returned:
    """One copy back in ``expirations``."""

    delay_ms: int  # the slot it was sent to
    since_confirm: float  # seconds from its confirmed publish to its return
    since_failure: float  # seconds from the instant they all failed


@dataclass(frozen=True)
class Run:
    """What one burst measured."""

    jitter: float
    returned: list[Returned]
    lost: int
    publish_seconds: float  # from the failure to the last confirmed copy


async def _held(channel: AbstractChannel, count: int) -> list[AbstractIncomingMessage]:
    """Publish ``count`` commands and take them from ``expirations``, unacked, as a
    consumer holds its deliveries."""
    exchange = await channel.get_exchange(EXCHANGE, ensure=False)
    now = datetime.now(UTC)
    await asyncio.gather(
        *(
            amqp.publish_confirmed(
                exchange,
                command_for(uuid.uuid4(), now),
                ROUTING_KEY,
                timeout=CONFIRM_TIMEOUT_SECONDS,
            )
            for _ in range(count)
        )
    )
    await channel.set_qos(prefetch_count=count)
    queue = await channel.get_queue(QUEUE, ensure=False)
    held: list[AbstractIncomingMessage] = []
    enough = asyncio.Event()

    async def hold(message: AbstractIncomingMessage) -> None:
        held.append(message)
        if len(held) == count:
            enough.set()

    tag = await queue.consume(hold)
    async with asyncio.timeout(CONFIRM_TIMEOUT_SECONDS):
        await enough.wait()
    await queue.cancel(tag)
    return held


async def _watch(channel: AbstractChannel, arrivals: dict[str, float], count: int) -> asyncio.Event:
    """Note when each message arrives in ``expirations``; the event is set at ``count``."""
    all_back = asyncio.Event()

    async def arrived(message: AbstractIncomingMessage) -> None:
        arrivals.setdefault(message.message_id or "", time.monotonic())
        if len(arrivals) == count:
            all_back.set()

    await (await channel.get_queue(QUEUE, ensure=False)).consume(arrived, no_ack=True)
    return all_back


async def burst(settings: Settings, url: str, count: int) -> Run:
    """Declare the topology of ``settings`` at ``url``, make ``count`` commands fail at once
    through ``Failures``, and time their return."""
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        await declare_topology(channel, topology_for(settings))
        held = await _held(channel, count)
        publisher = TimedPublisher(
            await channel.get_exchange(RETRY_EXCHANGE, ensure=False),
            await channel.get_exchange(DEAD_EXCHANGE, ensure=False),
            CONFIRM_TIMEOUT_SECONDS,
        )
        failures = Failures(settings, publisher, AckAlone(), Reporter(Metrics()))
        arrivals: dict[str, float] = {}
        all_back = await _watch(await connection.channel(), arrivals, count)
        deliveries = [Delivery.of(message, None) for message in held]
        failed_at = time.monotonic()
        await asyncio.gather(
            *(failures.handle(d, ConnectionRefusedError("database away")) for d in deliveries)
        )
        published = max((at for _, at in publisher.confirmed.values()), default=failed_at)
        with contextlib.suppress(TimeoutError):  # the report counts those not back
            left = published + settings.retry_delays[0] + GRACE_SECONDS - time.monotonic()
            async with asyncio.timeout(left):
                await all_back.wait()
    finally:
        await connection.close()
    returned = [
        Returned(delay_ms, arrivals[key] - confirmed_at, arrivals[key] - failed_at)
        for key, (delay_ms, confirmed_at) in publisher.confirmed.items()
        if key in arrivals
    ]
    lost = count - len(returned)
    return Run(settings.retry_jitter, returned, lost, published - failed_at)


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile of sorted ``values``."""
    return values[min(len(values) - 1, max(0, round(fraction * (len(values) - 1))))]


def histogram(waits: Sequence[float], low: float, high: float) -> list[tuple[str, int]]:
    """Counts in ``BUCKETS`` equal buckets over ``[low, high]`` (the first one takes what is
    below it: a copy of the lowest slot may be back a moment before its confirm reached
    us), and one bucket over the bound."""
    width = (high - low) / BUCKETS
    counts = Counter(
        BUCKETS if w > high else min(max(int((w - low) / width), 0), BUCKETS - 1) for w in waits
    )
    rows = [
        (f"{low + i * width:6.2f} - {low + (i + 1) * width:6.2f}", counts[i])
        for i in range(BUCKETS)
    ]
    rows.append((f"      > {high:6.2f}", counts[BUCKETS]))
    return rows


def _percentiles(values: Sequence[float]) -> str:
    ordered = sorted(values)
    return "  ".join(f"{name} {percentile(ordered, q):.3f}" for name, q in PERCENTILES)


def report(run: Run, delay: int, jitter: float, slack: float) -> None:
    """The figures of one run (the histogram over the window of ``jitter``)."""
    waits = sorted(r.since_confirm for r in run.returned)
    say(f"jitter {run.jitter:g}: {len(run.returned)} back, {run.lost} not back")
    say(f"  every copy confirmed within {run.publish_seconds:.2f} s of the failure")
    if not waits:
        return
    say("  wait in the delay queue (s, from the confirmed publish to the return):")
    rows = histogram(waits, delay * (1 - jitter) if jitter > 0 else delay / 2, delay)
    peak = max(count for _, count in rows) or 1
    for label, count in rows:
        say(f"    {label}  {count:5d}  {'#' * round(BAR_WIDTH * count / peak)}")
    say(f"    {_percentiles(waits)}")
    say(f"  wait from the failure (s):  {_percentiles([r.since_failure for r in run.returned])}")
    late = [r.since_confirm - r.delay_ms / 1000 for r in run.returned]
    say(f"  past the slot's TTL (s):    {_percentiles(late)}")
    slots = Counter(r.delay_ms for r in run.returned)
    say("  slots: " + ", ".join(f"{delay_label(ms)} {slots[ms]}" for ms in sorted(slots)))
    over, beyond = sum(w > delay for w in waits), sum(w > delay + slack for w in waits)
    say(
        f"  past the bound ({delay} s): {over}, by at most {max(waits[-1] - delay, 0):.3f} s; "
        f"past the bound + {slack:g} s of timer slack: {beyond} (must be 0)"
    )


async def measure(args: argparse.Namespace) -> int:
    """Both runs, each in a vhost of its own; 0 unless a copy did not come back."""
    url = (args.amqp_url or os.environ.get("AMQP_URL") or DEFAULT_AMQP_URL).split(",")[0]
    management = Management(args.management_url or url_beside(url))
    expected = slot_delays_ms(args.delay, args.jitter, args.slots)
    say(
        f"python -m bench.jitter: {args.count} commands fail at once, tier {args.delay} s, "
        f"jitter {args.jitter:g} over {args.slots} slots ({len(expected)} delay queues), "
        f"broker {redact(url)}"
    )
    lost = 0
    for jitter in dict.fromkeys((args.jitter, 0.0)):
        try:
            settings = Settings(
                amqp_url=(url,),
                retry_delays=(args.delay,),
                retry_jitter=jitter,
                retry_jitter_slots=args.slots,
                max_attempts=10,
                max_age_seconds=args.delay + 3600,
            )
        except ValidationError as exc:
            say(f"bad settings: {exc.errors()[0]['msg']}")
            return 2
        vhost = f"bench_jitter_{secrets.token_hex(4)}"
        async with vhost_created(management, vhost, user=amqp_user(url)):
            run = await burst(settings, with_vhost(url, vhost), args.count)
        say()
        report(run, args.delay, args.jitter, args.slack)
        lost += run.lost
    return 1 if lost else 0


def main() -> None:
    """Entry point: one line, not a traceback, when a server cannot be reached."""
    args = parser().parse_args()
    try:
        code = asyncio.run(measure(args))
    except (OSError, TimeoutError, ManagementUnavailable, AMQPError) as exc:
        print(redact(f"python -m bench.jitter: failed: {type(exc).__name__}: {exc}"))
        code = 1
    raise SystemExit(code)


if __name__ == "__main__":
    main()
