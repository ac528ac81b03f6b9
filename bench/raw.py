"""``python -m bench.raw publish|consume``: the broker's limits, with no database work.

Run as a subprocess by the benchmark, so that the figures come from a process
like the service's. ``publish`` sends COUNT persistent expiration commands (the
service's own message, same body and properties) through a direct exchange to
a quorum queue declared with the work queue's arguments, mandatory, with
publisher confirms, WINDOW outstanding at a time. ``consume`` takes them with a
large prefetch and acks every ACK_EVERY with ``multiple=True``. Each writes one
JSON object to ``--out``: the count, the seconds from the first publish (or
delivery) to the last confirm (or ack), and the CPU seconds of that interval.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import aio_pika
from aio_pika.abc import AbstractIncomingMessage, ExchangeType

from service.adapters.amqp.messages import command_for
from service.core.topology import QUEUE, ROUTING_KEY, ArgValue, build_topology

RAW_EXCHANGE = "bench.raw"
RAW_QUEUE = "bench.raw"
CONFIRM_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class Measured:
    """One raw measurement."""

    count: int
    seconds: float
    cpu_seconds: float

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else 0.0


def work_queue_arguments() -> dict[str, ArgValue]:
    """The arguments the service declares its work queue with."""
    (work,) = [q for q in build_topology((1,), jitter=0.0, slots=1).queues if q.name == QUEUE]
    return dict(work.arguments)


def commands(count: int) -> list[aio_pika.Message]:
    """``count`` expiration commands as the scan builds them."""
    now = datetime.now(UTC)
    return [command_for(uuid.uuid4(), now) for _ in range(count)]


async def publish(url: str, count: int, window: int) -> Measured:
    """Publish ``count`` commands with confirms, ``window`` outstanding at a time."""
    messages = commands(count)
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        exchange = await channel.declare_exchange(RAW_EXCHANGE, ExchangeType.DIRECT, durable=True)
        queue = await channel.declare_queue(
            RAW_QUEUE, durable=True, arguments=dict(work_queue_arguments())
        )
        await queue.bind(exchange, ROUTING_KEY)
        started, cpu = time.perf_counter(), time.process_time()
        for start in range(0, count, window):
            await asyncio.gather(
                *(
                    exchange.publish(
                        message, ROUTING_KEY, mandatory=True, timeout=CONFIRM_TIMEOUT_SECONDS
                    )
                    for message in messages[start : start + window]
                )
            )
        return Measured(count, time.perf_counter() - started, time.process_time() - cpu)
    finally:
        await connection.close()


class Taker:
    """Counts deliveries and acks every ``ack_every`` of them at once (``multiple=True``)."""

    def __init__(self, count: int, ack_every: int) -> None:
        self.count = count
        self.ack_every = ack_every
        self.received = 0
        self.first = 0.0
        self.cpu = 0.0
        self.done = asyncio.Event()

    async def on_message(self, message: AbstractIncomingMessage) -> None:
        self.received += 1
        number = self.received
        if number == 1:
            self.first, self.cpu = time.perf_counter(), time.process_time()
        if number % self.ack_every == 0 or number == self.count:
            await message.ack(multiple=True)
        if number == self.count:
            self.done.set()


async def consume(url: str, count: int, prefetch: int, ack_every: int) -> Measured:
    """Consume and ack ``count`` messages of the raw queue."""
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=prefetch)
        queue = await channel.get_queue(RAW_QUEUE, ensure=False)
        taker = Taker(count, ack_every)
        await queue.consume(taker.on_message)
        await taker.done.wait()
        elapsed = time.perf_counter() - taker.first
        return Measured(count, elapsed, time.process_time() - taker.cpu)
    finally:
        await connection.close()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.raw", description=__doc__)
    parser.add_argument("mode", choices=["publish", "consume"])
    parser.add_argument("--url", required=True, help="AMQP URL of the benchmark's vhost")
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--window", type=int, default=500, help="publish: confirms outstanding")
    parser.add_argument("--prefetch", type=int, default=1000, help="consume: prefetch")
    parser.add_argument("--ack-every", type=int, default=100, help="consume: multiple-ack span")
    parser.add_argument("--out", type=Path, required=True, help="where to write the result")
    return parser


def main() -> None:
    """Entry point."""
    args = _parser().parse_args()
    if args.mode == "publish":
        result = asyncio.run(publish(args.url, args.count, args.window))
    else:
        result = asyncio.run(consume(args.url, args.count, args.prefetch, args.ack_every))
    args.out.write_text(json.dumps({**asdict(result), "rate": result.rate}))


if __name__ == "__main__":
    main()
