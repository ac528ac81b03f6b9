"""What a trace backend receives stays what it was: the same traced run (``tests.trace_run``:
the scan's publishes, and deliveries of every kind through the real consumer), exported
over OTLP by the export child to an in-memory receiver, gives span for span what the
tree before the consumer recorded its spans compactly gave (951240a, kept in
``tests/data/trace_run_951240a.json``), but for ids and times."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BEFORE = Path(__file__).parent.parent / "data" / "trace_run_951240a.json"


def test_the_spans_of_a_traced_run_are_those_of_the_tree_before() -> None:
    # A process of its own: it installs the global tracer provider, as a service does.
    done = subprocess.run(
        [sys.executable, "-m", "tests.trace_run"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=Path(__file__).parent.parent.parent,
    )
    now = json.loads(done.stdout)
    before = json.loads(BEFORE.read_text())
    assert len(now) == len(before) == 17
    for got, expected in zip(now, before, strict=True):
        assert got == expected, got["id"]
    assert all(span["timed"] for span in now)
