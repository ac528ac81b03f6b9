"""Where observing a job's CPU goes, per 1,000 deliveries: ``python -m bench.profile``.

Runs one ``bench.observe`` mode under py-spy (``pip install py-spy``; not a dependency
of the service) and prints, for the consumer's event loop thread while it works the
deliveries, what each part of the work costs in ms of CPU per 1,000 deliveries: the
samples that fall in a part, over all of the loop's samples in that time, times the
loop thread's CPU per delivery that the same run measured. A part's frames are named
in ``PARTS``; a sample counts in the first part one of its frames matches. The
export child, a process of its own, is ``bench.observe``'s ``child`` column.
"""

from __future__ import annotations

import argparse
import inspect
import json
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

from bench import observe

# (what it is, the frames that make it: "Function (file" prefixes), first match wins.
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "start a span (the SDK's, or recorded: sampler, ids, attributes)",
        ("Tracer.start_span (", "Recorder.start (", "RecordedSpan.child ("),
    ),
    (
        "span ends, hand-off to the export child",
        ("ProcessSpanProcessor.on_end (", "ProcessSpanProcessor.record (", "RecordedSpan.end ("),
    ),
    ("SDK: end a span (without the hand-off)", ("Span.end (",)),
    (
        "set an attribute after the start",
        ("Span.set_attribute (", "RecordedSpan.set_attribute ("),
    ),
    (
        "read the trace context (traceparent, replay link)",
        ("extract (propagate/", "unsampled_traceparent (", "remote_parent (", "link_of ("),
    ),
    (
        "context of the span (set, attach, detach)",
        ("set_span_in_context (", "attach (", "detach ("),
    ),
    ("batch span (one per batch, links to its jobs)", ("_batch_span (",)),
    ("metrics (counters and histograms)", ("Metrics.", "LocalHistogram.", "_Counter.")),
)
OTHER = "the job itself (parse, batch, ack, bookkeeping)"
# Functions outside the measured loop: set-up, and the flush and shutdown after it.
OUTSIDE = frozenset({"_find_and_load", "_messages", "force_flush", "shutdown", "Batcher.close"})


def _outside(frame: str) -> bool:
    """The frame is one of ``OUTSIDE``'s functions (by its name, or a method's after its
    class)."""
    name = frame.split(" (", 1)[0]
    return name in OUTSIDE or name.rsplit(".", 1)[-1] in OUTSIDE


def _loop_lines() -> range:
    """The lines of ``observe._run`` that feed the deliveries (the measured loop)."""
    lines, first = inspect.getsourcelines(observe._run)
    start = next(i for i, line in enumerate(lines) if "for first in range(" in line)
    end = next(i for i, line in enumerate(lines) if "handled = time.process_time()" in line)
    return range(first + start, first + end)


def measured(
    stacks: Iterable[tuple[list[str], int]], loop: range
) -> Iterator[tuple[list[str], int]]:
    """The event loop thread's samples taken while it works the deliveries: under the
    loop, in the feeding lines of ``_run`` or in a callback it scheduled, and in none of
    the set-up, flush or shutdown frames."""
    for frames, count in stacks:
        if not any(frame.startswith("BaseEventLoop.run_forever (") for frame in frames):
            continue
        if any(_outside(frame) for frame in frames):
            continue
        runs = [frame for frame in frames if frame.startswith("_run (bench/observe.py:")]
        if runs and int(runs[-1].rsplit(":", 1)[1].rstrip(")")) not in loop:
            continue
        yield frames, count


def part_of(frames: list[str]) -> str:
    """The first part one of the frames belongs to (outermost frame first)."""
    for name, prefixes in PARTS:
        if any(frame.startswith(prefixes) for frame in frames):
            return name
    return OTHER


def read_raw(path: Path) -> list[tuple[list[str], int]]:
    """py-spy's ``--format raw``: one ``frame;frame;... count`` line per stack."""
    stacks = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack:
            stacks.append((stack.split(";"), int(count)))
    return stacks


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("--mode", default="trace100", choices=sorted(observe.MODES))
    parser.add_argument("--count", type=int, default=50_000)
    parser.add_argument("--burst", type=int, default=100)
    parser.add_argument("--rate", type=int, default=1000, help="py-spy samples per second")
    parser.add_argument("--py-spy", default=shutil.which("py-spy") or "py-spy")
    args = parser.parse_args()
    if shutil.which(args.py_spy) is None:
        sys.exit("py-spy is not installed: pip install py-spy (or --py-spy PATH)")
    sink, endpoint, folder = observe.start_sink()
    raw = Path(tempfile.mkdtemp(prefix="profile-")) / "raw.txt"
    try:
        # --nonblocking: sampling never pauses it, its CPU is its own
        spy = [args.py_spy, "record", "--nonblocking", "--rate", str(args.rate)]
        observed = observe.mode_command(args.mode, args.count, args.burst, endpoint)
        out = subprocess.run(
            [*spy, "--format", "raw", "--output", str(raw), "--", *observed],
            check=True,
            capture_output=True,
            text=True,
            env=observe.mode_env(),
        )
    finally:
        sink.terminate()
        sink.wait()
        shutil.rmtree(folder, ignore_errors=True)
    result = json.loads(
        next(line for line in reversed(out.stdout.splitlines()) if line.startswith("{"))
    )
    per_delivery = result["us_loop_thread"]  # µs per delivery = ms per 1,000 deliveries
    parts: Counter[str] = Counter()
    for frames, count in measured(read_raw(raw), _loop_lines()):
        parts[part_of(frames)] += count
    total = sum(parts.values())
    if not total:
        sys.exit("py-spy took no sample of the loop: raise --count or --rate")
    print(
        f"{args.mode} ({observe.MODES[args.mode]}): {args.count:,} deliveries in bursts of "
        f"{args.burst}; the loop thread {per_delivery:.1f} ms of CPU per 1,000 deliveries, "
        f"{total:,} samples"
    )
    print(f"{'ms per 1,000':>12} {'share':>6}  part")
    for name, _ in (*PARTS, (OTHER, ())):
        if parts[name]:
            share = parts[name] / total
            print(f"{share * per_delivery:12.1f} {share:6.0%}  {name}")
    print(f"(child, the export process: {result['us_child']:.1f} ms per 1,000 deliveries)")
    print(f"py-spy's samples (flamegraph.pl reads them): {raw}")


if __name__ == "__main__":
    main()
