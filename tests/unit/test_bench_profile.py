"""bench.profile counts a sample in the part its frames name, and only samples of the
measured loop."""

from __future__ import annotations

from pathlib import Path

from bench import profile

LOOP = "BaseEventLoop.run_forever (asyncio/base_events.py:607)"


def _run_at(line: int) -> str:
    return f"_run (bench/observe.py:{line})"


def test_samples_are_split_by_part_and_only_the_loop_counts(tmp_path: Path) -> None:
    loop = profile._loop_lines()
    inside, before = loop.start + 1, loop.start - 5
    raw = tmp_path / "raw.txt"
    raw.write_text(
        "\n".join(
            [
                # in the feeding loop: a span's start, with an attribute set inside it
                f"main (bench/observe.py:1);{LOOP};{_run_at(inside)};Delivery.of (d.py:1);"
                "Tracer.start_span (trace/__init__.py:1);Span.set_attribute (t.py:2) 7",
                # a callback the loop ran: an ack ending a span, handed to the child
                f"{LOOP};Consumer._end (c.py:1);Span.end (trace/__init__.py:9);"
                "ProcessSpanProcessor.on_end (service/adapters/telemetry/span_export.py:1) 5",
                f"{LOOP};Consumer._ack (c.py:1) 11",
                # set-up before the loop, an import, the flush after: not counted
                f"{LOOP};{_run_at(before)};Consumer.__init__ (c.py:1) 100",
                f"{LOOP};{_run_at(inside)};_find_and_load (<frozen>:1) 100",
                f"{LOOP};TracerProvider.force_flush (t.py:1) 100",
                f"{LOOP};Batcher.close (service/worker/batcher.py:1) 100",
                # another thread
                "Thread.run (threading.py:1);ProcessSpanProcessor._tick (s.py:1) 100",
            ]
        )
        + "\n"
    )
    counted: dict[str, int] = {}
    for frames, count in profile.measured(profile.read_raw(raw), loop):
        part = profile.part_of(frames)
        counted[part] = counted.get(part, 0) + count
    assert counted == {
        "start a span (the SDK's, or recorded: sampler, ids, attributes)": 7,
        "span ends, hand-off to the export child": 5,
        profile.OTHER: 11,
    }
