"""The end of a run: what the database and the queues hold, the summary and its checks."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from service.adapters import postgres
from service.adapters.postgres import demo as demo_sql
from service.core.topology import DEAD_QUEUE, QUEUE
from service.demo.support import Support
from service.demo.watch import Queues
from service.worker.reporting import SUMMARY_FIELDS


@dataclass(frozen=True)
class Final:
    """What the database and the queues hold once everything stopped."""

    states: dict[str, int]
    lag: dict[str, float]
    by_worker: dict[str, int]
    dead: int
    queued: int


async def final_state(conn: postgres.Connection, queues: Queues) -> Final:
    """Final states, expiry lag, expirations per consumer, queue depths."""
    return Final(
        states=await demo_sql.final_states(conn),
        lag=await demo_sql.expiry_lag(conn),
        by_worker=await demo_sql.expiries_by_worker(conn),
        dead=await queues.ready(DEAD_QUEUE),
        queued=await queues.ready(QUEUE),
    )


def delivery_outcomes(logs: Iterable[Path]) -> Counter[str]:
    """Add up the consumers' ``expiry.summary`` lines (outcomes by count, at ``INFO``) and
    count their ``expiry.retry`` and ``expiry.dead_letter`` lines."""
    counts: Counter[str] = Counter()
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError, TypeError):
                entry = json.loads(line)
                if entry.get("event") == "expiry.summary":
                    for outcome, field in SUMMARY_FIELDS.items():
                        counts[outcome.value] += int(entry.get(field, 0))
                elif entry.get("event") in ("expiry.retry", "expiry.dead_letter"):
                    counts[str(entry["event"]).removeprefix("expiry.")] += 1
    return +counts


@dataclass(frozen=True)
class Report:
    """Everything the summary shows, and whether the run passed."""

    settled: bool
    elapsed: float
    final: Final
    support: Support
    exit_codes: dict[str, int]
    deliveries: Counter[str]

    def checks(self) -> list[tuple[str, bool]]:
        s = self.final.states
        return [
            ("every hold ended in exactly one state", s["expired"] + s["consumed"] == s["placed"]),
            ("no held hold past its deadline", s["held"] == 0 and s["held_past_deadline"] == 0),
            (
                "exactly one transition per expired hold, none per consumed hold",
                s["expired_not_once"] == 0 and s["consumed_with_transition"] == 0,
            ),
            (
                "every consumed hold was consumed by the support side",
                s["consumed"] == len(self.support.consumed),
            ),
            ("zero dead letters", self.final.dead == 0),
            ("every process exited 0", all(code == 0 for code in self.exit_codes.values())),
            ("settled before the timeout", self.settled),
        ]

    @property
    def ok(self) -> bool:
        return all(passed for _, passed in self.checks())


def _state_rows(report: Report) -> list[tuple[str, str]]:
    s, sup = report.final.states, report.support
    return [
        ("holds placed", f"{s['placed']}"),
        ("expired by the service", f"{s['expired']}"),
        ("consumed by support", f"{s['consumed']}"),
        (
            "support at the deadline",
            f"tried {sup.tried}: {len(sup.consumed)} consumed, "
            f"{sup.too_late} found already expired",
        ),
        ("still held", f"{s['held']} ({s['held_past_deadline']} past their deadline)"),
        ("ended in exactly one state", f"{s['expired'] + s['consumed']} of {s['placed']}"),
        (
            "transitions per expired hold",
            f"min {s['min_transitions']}, max {s['max_transitions']} "
            f"({s['expired_not_once']} not exactly 1; "
            f"{s['consumed_with_transition']} on consumed holds)",
        ),
        ("dead letters", f"{report.final.dead}"),
        ("left in the work queue", f"{report.final.queued}"),
    ]


def _flow_rows(report: Report) -> list[tuple[str, str]]:
    s, lag, d = report.final.states, report.final.lag, report.deliveries
    rate = s["expired"] / lag["window"] if lag["window"] > 0 else 0.0
    per_consumer = ", ".join(f"{w} {n}" for w, n in report.final.by_worker.items())
    return [
        (
            "deliveries",
            f"{d['expired']} expired, {d['already-done']} already-done, "
            f"{d['not-eligible']} not-eligible, {d['retry']} retried, "
            f"{d['dead_letter']} dead-lettered",
        ),
        ("expirations by consumer", per_consumer or "none"),
        (
            "expiry lag after deadline",
            f"p50 {lag['p50']:.2f}s, p95 {lag['p95']:.2f}s, max {lag['max']:.2f}s",
        ),
        ("elapsed", f"{report.elapsed:.1f}s"),
        (
            "throughput",
            f"{rate:.0f} expirations/s as the holds came due ({s['expired']} in the "
            f"{lag['window']:.1f}s from the first deadline to the last expiry)",
        ),
    ]


def summary(report: Report) -> list[str]:
    """The summary table, one line each, then the checks."""
    rows = _state_rows(report) + _flow_rows(report)
    lines = [f"  {label:<29} {value}" for label, value in rows]
    lines += [f"  [{'ok' if passed else 'FAILED'}] {what}" for what, passed in report.checks()]
    return lines
