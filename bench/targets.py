"""The issue's targets, judged on a run's figures (ratios of neighbours in each
repetition, on their median), and the ratios that have no target."""

from __future__ import annotations

from bench.config import Options
from bench.report import Check, Results, below_check, ratio, ratio_check, show_ratio

MEMORY_LIMIT_MB = 150.0
LAG_BUDGET_SECONDS = 2.0  # plus the scan interval


def targets(results: Results, options: Options) -> list[Check]:
    """The issue's targets: ratios of neighbours in each repetition, judged on their median."""
    checks = [
        ratio_check(
            results,
            "end-to-end, 1 consumer vs per-message path",
            "e2e.k1",
            "e2e.per_message",
            5,
            times=True,
        ),
        ratio_check(
            results, "end-to-end, 1 consumer vs raw consume + ack", "e2e.k1", "raw.consume", 0.75
        ),
        ratio_check(
            results,
            "end-to-end, 1 consumer vs the Dramatiq peer",
            "e2e.k1",
            "e2e.peer",
            4,
            times=True,
        ),
        ratio_check(
            results,
            "capacity at the lag objective vs raw publish with confirms",
            "capacity.rate",
            "raw.publish",
            0.6,
        ),
        ratio_check(results, "/metrics on vs off", "e2e.metrics", "e2e.k1", 0.9),
        ratio_check(results, "tracing 100% sampled vs tracing off", "e2e.trace100", "e2e.k1", 0.5),
        ratio_check(results, "tracing 10% sampled vs tracing off", "e2e.trace10", "e2e.k1", 0.9),
        ratio_check(
            results,
            "production profile (/metrics + tracing 10%) vs bare default",
            "e2e.production",
            "e2e.k1",
            0.85,
        ),
    ]
    checks += [
        ratio_check(results, f"end-to-end, {count} consumers vs 1", f"e2e.k{count}", "e2e.k1", 1.0)
        for count in options.consumers
        if count > 1
    ]
    budget = LAG_BUDGET_SECONDS + options.scan_every
    checks += [
        ratio_check(results, "scan vs raw publish with confirms", "scan.rate", "raw.publish", 0.8),
        ratio_check(
            results,
            "scan while consumers run vs raw publish",
            "sustained.scan",
            "raw.publish",
            0.8,
        ),
        below_check(
            results,
            f"scan peak RSS, {options.scan_holds:,} due holds",
            "scan_memory.rss",
            MEMORY_LIMIT_MB,
            "MB",
        ),
        below_check(results, f"lag p99 at a sustained {options.rate:,}/s", "lag.p99", budget, "s"),
    ]
    return checks


def other_ratios(results: Results) -> list[tuple[str, str]]:
    """Ratios with no target: where the per-message path and the two limits stand."""
    pairs = [
        ("per-message path vs raw consume + ack", "e2e.per_message", "raw.consume"),
        ("1 consumer, 5% of rows locked (the others) vs none locked", "locked.rate", "e2e.k1"),
        ("capacity, 2 scanners vs 1", "capacity.scanners2", "capacity.rate"),
        ("batched update (no broker) vs raw consume + ack", "db.batched", "raw.consume"),
        ("end-to-end, 1 consumer vs batched update (no broker)", "e2e.k1", "db.batched"),
        ("raw consume + ack vs raw publish with confirms", "raw.consume", "raw.publish"),
    ]
    return [(what, show_ratio(ratio(results, top, bottom))) for what, top, bottom in pairs]
