"""What observing a job costs the consumer's own code, per 1,000 deliveries, without the
broker's or the database's noise: ``python -m bench.observe``.

Each mode runs in a process of its own (a tracer provider is process-wide): the real
``Consumer``, ``Batcher``, ``Reporter`` and ``Metrics`` over a store that answers at
once, fed N deliveries in bursts of ``--burst`` (what one socket read brings), each
burst a batch. Tracing exports over OTLP/HTTP to ``bench.sink``, as the benchmark's
traced consumers do. CPU is the process's (every thread: the export's encoding too),
from the first delivery to the last span exported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast
from uuid import UUID

from service.adapters.amqp.consuming import AmqpMessage
from service.core.domain import BatchRow, command_body

MODES = {
    "bare": "no tracing, no metrics reader",
    "metrics-sdk": "/metrics, histograms through the SDK",
    "metrics": "/metrics, histograms aggregated here (what ships)",
    "trace10": "tracing, 10% sampled at the head",
    "trace100": "tracing, 100% sampled",
    "production": "/metrics + tracing 10% at the head",
    "trace100-noexport": "tracing, 100% sampled, spans dropped at export (no encoding)",
    "trace100-inprocess": "tracing, 100% sampled, OTLP encoded in this process (before)",
    "trace10-discard": "tracing, 10% sampled at the head, the export child discards them",
    "trace100-discard": "tracing, 100% sampled, the export child discards them",
}
# Any mode with this suffix: gc.freeze() once set up, before the first delivery (the A/B
# of the consumer's own freeze, service/worker/process.py).
FREEZE = "+freeze"


def described(mode: str) -> str:
    """What ``mode`` runs."""
    base = mode.removesuffix(FREEZE)
    return MODES[base] + (", start-up objects frozen (gc.freeze)" if mode != base else "")


@dataclass
class Message:
    """A delivery as the consumer reads it (settled through ``ack``)."""

    body: bytes
    message_id: str
    headers: dict[str, Any]
    delivery_tag: int
    exchange: str = "expirations"
    routing_key: str = "expire"
    redelivered: bool = False
    content_type: str | None = "application/json"
    content_encoding: str | None = None
    correlation_id: str | None = None
    timestamp: None = None
    type: str | None = None
    app_id: str | None = None
    acked: bool = False

    async def ack(self) -> None:
        self.acked = True

    async def reject(self, requeue: bool = False) -> None:
        raise RuntimeError("a bench delivery is never rejected")


@dataclass
class Store:
    """Every hold held and due: each batch wins all its rows."""

    batches: list[int] = field(default_factory=list)

    async def expire_many(
        self,
        ids: Sequence[UUID],
        message_ids: Sequence[str],
        attempts: Sequence[int],
        traceparents: Sequence[str | None],
    ) -> dict[UUID, BatchRow]:
        self.batches.append(len(ids))
        await asyncio.sleep(0)
        return {rid: BatchRow(won=True, lag=0.2, status="expired", due=True) for rid in ids}

    async def expire_one(self, *_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("no delivery goes alone here")

    async def mark_handling(self, key: str) -> int:
        return 1

    async def clear_handling(self, key: str) -> None:
        return None


def _messages(first: int, count: int, sampled_every: int | None) -> list[Message]:
    """Commands tagged from ``first``; with ``sampled_every``, a traceparent on each,
    every n-th sampled."""
    messages = []
    for tag in range(first, first + count):
        rid = uuid.uuid4()
        headers: dict[str, Any] = {}
        if sampled_every is not None:
            flags = "01" if tag % sampled_every == 0 else "00"
            headers["traceparent"] = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-{flags}"
        body = command_body(rid, _NOW)
        messages.append(Message(body, f"expire:{rid}:1", headers, tag))
    return messages


_NOW = datetime.now(UTC)


async def _run(  # noqa: C901 (one mode's set-up, then one loop)
    mode: str, count: int, burst: int, endpoint: str | None
) -> dict[str, float]:
    import gc

    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import REGISTRY

    from service.adapters.telemetry import ConsumerTracing, add_processor, propagation, recorder_of
    from service.adapters.telemetry.metrics import Metrics
    from service.settings import Settings
    from service.worker.acks import AckAlone
    from service.worker.batcher import Batcher
    from service.worker.consumer import Consumer
    from service.worker.failpoints import NO_FAILPOINTS
    from service.worker.failures import Failures
    from service.worker.inflight import InFlight
    from service.worker.quarantine import Quarantine
    from service.worker.reporting import Reporter

    freeze = mode.endswith(FREEZE)
    mode = mode.removesuffix(FREEZE)
    tracing = None
    provider = None
    sampled_every = None
    if mode.startswith("trace") or mode == "production":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace import TracerProvider, sampling
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )

        class Dropping(SpanExporter):
            def export(self, spans: Any) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        sampled_every = 1 if mode.startswith("trace100") else 10
        provider = TracerProvider(sampler=sampling.ParentBased(sampling.ALWAYS_ON))
        from opentelemetry.sdk.resources import Resource

        from service.adapters.telemetry.span_export import ProcessSpanProcessor

        if mode.endswith("noexport"):
            add_processor(provider, BatchSpanProcessor(Dropping()))
        elif mode.endswith("inprocess"):
            add_processor(provider, BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        else:  # what ships: a child process encodes and sends
            env = {**os.environ, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": str(endpoint)}
            discard = ["sh", "-c", "exec cat >/dev/null"] if mode.endswith("discard") else None
            add_processor(provider, ProcessSpanProcessor(Resource.create({}), env, command=discard))
        trace.set_tracer_provider(provider)
        propagation.install()
        tracing = ConsumerTracing(recorder_of(provider, "service.consume"), follows_head=True)
    registry = None
    meters = None
    if mode in ("metrics-sdk", "metrics", "production"):
        from opentelemetry.exporter.prometheus import PrometheusMetricReader

        meters = MeterProvider(metric_readers=[PrometheusMetricReader()])
        metrics.set_meter_provider(meters)
        registry = None if mode == "metrics-sdk" else REGISTRY
    settings = Settings(database_url="postgresql://bench@localhost/x", amqp_url="amqp://localhost/")
    store, in_flight, acks = Store(), InFlight(), AckAlone()
    reporter = Reporter(Metrics(prometheus=registry))
    batcher = Batcher(store, size=100, wait_ms=5, workers=2)
    consumer = Consumer(
        batcher=batcher,
        store=store,
        quarantine=Quarantine(store, NO_FAILPOINTS),
        failures=Failures(settings, None, acks, reporter),  # type: ignore[arg-type]
        acks=acks,
        reporter=reporter,
        failpoints=NO_FAILPOINTS,
        in_flight=in_flight,
        tracing=tracing,
    )
    # Each burst's messages are made just before it (their making's CPU is taken out)
    # and let go after it, as a consumer lets go of what it acked: a list of them all
    # would be a heap the garbage collector walks again and again, as no consumer's is.
    making, unacked = 0.0, 0
    if freeze:
        gc.freeze()
    started = time.process_time()
    main_started = time.thread_time()
    wall = time.perf_counter()
    for first in range(1, count + 1, burst):
        made = time.thread_time()
        messages = _messages(first, min(burst, count + 1 - first), sampled_every)
        making += time.thread_time() - made
        for message in messages:
            await consumer.on_message(cast(AmqpMessage, message))
        while len(in_flight):  # noqa: ASYNC110 (a turn at a time, as the loop runs them)
            await asyncio.sleep(0)
        unacked += sum(not m.acked for m in messages)
    handled = time.process_time() - making
    main_thread = time.thread_time() - main_started - making
    if provider is not None:
        provider.force_flush()
        provider.shutdown()
    done = time.process_time() - making
    child = resource.getrusage(resource.RUSAGE_CHILDREN)
    await batcher.close()
    if unacked:
        raise RuntimeError(f"{unacked} deliveries were not acked")
    return {
        "us_per_delivery": (done - started) / count * 1e6,
        "us_before_export": (handled - started) / count * 1e6,
        "us_loop_thread": main_thread / count * 1e6,
        "us_child": (child.ru_utime + child.ru_stime) / count * 1e6,
        "wall_s": time.perf_counter() - wall,
        "mean_batch": sum(store.batches) / len(store.batches),
    }


def mode_command(mode: str, count: int, burst: int, endpoint: str) -> list[str]:
    """The command that runs one mode in a process of its own (a line of JSON, last)."""
    return [
        *(sys.executable, "-m", "bench.observe", "--mode", mode),
        *("--count", str(count), "--burst", str(burst), "--endpoint", endpoint),
    ]


def mode_env() -> dict[str, str]:
    """A mode's environment: this one, with the same hash seed for every run."""
    return {**os.environ, "PYTHONHASHSEED": "0"}


def start_sink() -> tuple[subprocess.Popen[bytes], str, Path]:
    """``bench.sink`` on a port of its own: the process, its OTLP/HTTP traces URL, its folder."""
    folder = Path(tempfile.mkdtemp(prefix="observe-"))
    port_file = folder / "port"
    sink = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.sink",
            "--port-file",
            str(port_file),
            "--out",
            str(folder / "out.json"),
        ]
    )
    for _ in range(300):
        if port_file.exists() and port_file.read_text():
            return sink, f"http://127.0.0.1:{port_file.read_text()}/v1/traces", folder
        time.sleep(0.05)
    sink.kill()
    raise RuntimeError("the OTLP sink did not start")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.observe", description=__doc__)
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--burst", type=int, default=100, help="deliveries per burst (batch)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default=",".join(MODES))
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(asyncio.run(_run(args.mode, args.count, args.burst, args.endpoint))))
        return
    sink, endpoint, folder = start_sink()
    try:
        modes = [m for m in args.only.split(",") if m]
        results: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
        for _ in range(args.repeat):  # the modes alternate: a slow minute hits them all
            for mode in modes:
                out = subprocess.run(
                    mode_command(mode, args.count, args.burst, endpoint),
                    check=True,
                    capture_output=True,
                    text=True,
                    env=mode_env(),
                )
                results[mode].append(json.loads(out.stdout.splitlines()[-1]))
    finally:
        sink.terminate()
        sink.wait()
    base = sorted(r["us_per_delivery"] for r in results.get("bare", []))
    bare = base[len(base) // 2] if base else None
    print(
        f"{args.count:,} deliveries in bursts of {args.burst}, median of {args.repeat} "
        "(us of CPU per delivery: the process's, and its event loop thread's)"
    )
    print(f"{'mode':18} {'us/delivery':>12} {'loop thread':>12} {'child':>6} {'vs bare':>8}  what")
    for mode in modes:
        runs = sorted(results[mode], key=lambda r: r["us_per_delivery"])
        mid = runs[len(runs) // 2]
        ratio = f"{bare / mid['us_per_delivery']:.0%}" if bare else "-"
        print(
            f"{mode:18} {mid['us_per_delivery']:12.1f} {mid['us_loop_thread']:12.1f} "
            f"{mid['us_child']:6.1f} {ratio:>8}  "
            f"{described(mode)}"
        )
    print(f"spans the sink was sent: {json.loads((folder / 'out.json').read_text())['spans']:,}")


if __name__ == "__main__":
    main()
