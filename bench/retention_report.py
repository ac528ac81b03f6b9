"""``bench.retention``'s figures: the tables it prints for its two experiments, and the
same figures as JSON (``--json``)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from bench.retention_experiments import PerThousand, Plan, Year
from bench.table_sizes import (
    APPLICATION,
    GROWING,
    SERVICE_TABLES,
    Sizes,
    scaled,
    scaled_total,
    total,
)
from service.settings import Settings

MILLION = 1_000_000
NAMED = ("reservation_transitions", "publish_leases", "scan_passes")


def per_thousand_lines(found: PerThousand) -> list[str]:
    def per_k(count: float) -> str:
        return f"{count * 1000 / found.expiries:,.0f}"

    def row(label: str, before: tuple[str, str, float], after: tuple[str, str, float]) -> str:
        return (
            f"  {label:34} {before[0]:>9} {before[1]:>11} {_mb(before[2]):>10}   "
            f"{after[0]:>9} {after[1]:>11} {_mb(after[2]):>10}"
        )

    def one(name: str, note: str = "") -> str:
        b, a = found.before[name], found.after[name]
        return row(
            name,
            (f"{b.rows:,}", per_k(b.bytes), b.bytes),
            (f"{a.rows:,}", per_k(a.bytes), a.bytes),
        ) + (f"   {note}" if note else "")

    side = f"{'rows':>9} {'bytes/1000':>11} {'on disk':>10}"
    others = [n for n in SERVICE_TABLES if n not in NAMED]
    growing = [sum(sizes[n].bytes for n in GROWING) for sizes in (found.before, found.after)]
    totals = [total(sizes) for sizes in (found.before, found.after)]
    rest = [sum(sizes[n].bytes for n in others) for sizes in (found.before, found.after)]
    return [
        f"1. bytes per 1,000 expiries: {found.expiries:,} expiries, before and after one "
        "retention run",
        f"  {'':34} {'before retention':^32}   {'after retention':^32}",
        f"  {'table':34} {side}   {side}",
        one("reservation_transitions"),
        one("publish_leases", "(after: the index's emptied pages, reused by new leases)"),
        row(
            "  the two, per expiry",
            ("", per_k(growing[0]), growing[0]),
            ("", per_k(growing[1]), growing[1]),
        ),
        one("scan_passes", "(one row per scanner: does not grow with the expiries)"),
        row(f"the other {len(others)} service tables", ("", "", rest[0]), ("", "", rest[1]))
        + "   (empty partitions; retention's records)",
        row(
            "the service tables, total",
            ("", per_k(totals[0]), totals[0]),
            ("", per_k(totals[1]), totals[1]),
        ),
        one(APPLICATION, "(the application's table, apart: never deleted by the service)"),
        "  the retention run: " + ("; ".join(found.run) or "nothing to do"),
    ]


def year_lines(plan: Plan, kept: Year, unkept: Year, retention_days: int) -> list[str]:
    scale = MILLION / plan.per_day
    share = f"1/{scale:,.0f} of a million" if scale >= 1 else f"{1 / scale:,.0f} million"
    side = f"{'rows':>11} {'on disk':>10} {'at 1M/day':>10}"
    lines = [
        f"2. a year at {plan.per_day:,} expiries a day ({share}): {plan.days} days, "
        f"{plan.start:%Y-%m-%d} to {plan.end:%Y-%m-%d} (a Monday), "
        f"{plan.days * plan.per_day:,} expiries",
        f"  {'':34} {'with retention (' + str(retention_days) + ' days)':^33}   "
        f"{'without (the inserts only)':^33}",
        f"  {'table':34} {side}   {side}",
    ]

    def row(
        label: str, rows: tuple[str, str], disk: tuple[float, float], at: tuple[str, str]
    ) -> str:
        return (
            f"  {label:34} {rows[0]:>11} {_mb(disk[0]):>10} {at[0]:>10}   "
            f"{rows[1]:>11} {_mb(disk[1]):>10} {at[1]:>10}"
        )

    def one(name: str) -> str:
        k, u = kept.sizes[name], unkept.sizes[name]
        line = row(
            name,
            (f"{k.rows:,}", f"{u.rows:,}"),
            (k.bytes, u.bytes),
            (_gb(scaled(kept.sizes, name, scale)), _gb(scaled(unkept.sizes, name, scale))),
        )
        return line + (f"   ({k.partitions} / {u.partitions} partitions)" if k.partitions else "")

    shown = [n for n in SERVICE_TABLES if n in NAMED or kept.sizes[n].rows or unkept.sizes[n].rows]
    rest = [n for n in SERVICE_TABLES if n not in shown]
    lines += [one(name) for name in shown]
    k_rest = sum(kept.sizes[n].bytes for n in rest)
    u_rest = sum(unkept.sizes[n].bytes for n in rest)
    lines.append(
        row(f"the other {len(rest)} (empty) service tables", ("", ""), (k_rest, u_rest), ("", ""))
    )
    k_total, u_total = total(kept.sizes), total(unkept.sizes)
    lines.append(
        row(
            "the service tables, total",
            ("", ""),
            (k_total, u_total),
            (_gb(scaled_total(kept.sizes, scale)), _gb(scaled_total(unkept.sizes, scale))),
        )
    )
    lines += [
        one(APPLICATION) + "   (the application's table, apart: never deleted by the service)",
        f"  at 1M/day: linear scaling, x{scale:,.0f}, of {', '.join(GROWING)} and "
        "reservations (their size is linear in their rows); the other tables, which do not "
        "grow with the rate, as measured",
        "  publish_leases with retention: the room of a week of leases (one run a week; "
        "emptied by each run, reused after the VACUUM)",
        f"  retention: {kept.runs} runs, one per simulated week; {kept.dropped} partitions "
        f"dropped ({kept.dropped_rows:,} rows), {kept.made} made; pruned "
        + (", ".join(f"{t} {n:,}" for t, n in sorted(kept.pruned.items())) or "nothing")
        + f"; a run took {_seconds(kept.run_seconds)}",
        f"  inserts: {kept.insert_seconds:.0f} s with retention, {unkept.insert_seconds:.0f} s"
        " without (both databases at once)",
    ]
    return lines


def figures(
    base: Settings, unit: PerThousand, plan: Plan, kept: Year, unkept: Year, elapsed: float
) -> dict[str, Any]:
    """Both experiments' figures, as ``--json`` writes them."""
    scale = MILLION / plan.per_day
    return {
        "settings": {
            "retention_days": base.retention_days,
            "retention_ahead_days": base.retention_ahead_days,
            "lease_seconds": base.lease_seconds,
        },
        "per_thousand": {
            "expiries": unit.expiries,
            "before": _sizes_json(unit.before),
            "after": _sizes_json(unit.after),
            "service_bytes_per_1000_before": total(unit.before) * 1000 / unit.expiries,
            "service_bytes_per_1000_after": total(unit.after) * 1000 / unit.expiries,
            "retention_run": unit.run,
        },
        "year": {
            "start": plan.start.isoformat(),
            "end": plan.end.isoformat(),
            "days": plan.days,
            "per_day": plan.per_day,
            "with_retention": _sizes_json(kept.sizes),
            "without_retention": _sizes_json(unkept.sizes),
            "service_bytes_with_retention": total(kept.sizes),
            "service_bytes_without_retention": total(unkept.sizes),
            "scale_to_a_million_a_day": scale,
            "service_bytes_with_retention_scaled": scaled_total(kept.sizes, scale),
            "service_bytes_without_retention_scaled": scaled_total(unkept.sizes, scale),
            "scaling": "linear in the rows for reservation_transitions, publish_leases and "
            "reservations; the other tables as measured",
            "reservations_bytes_scaled": kept.sizes[APPLICATION].bytes * scale,
            "retention_runs": kept.runs,
            "retention_run_seconds": kept.run_seconds,
            "dropped_partitions": kept.dropped,
            "dropped_rows": kept.dropped_rows,
            "pruned": kept.pruned,
        },
        "elapsed_seconds": elapsed,
    }


def _mb(count: float) -> str:
    return f"{count / 1e6:,.1f} MB"


def _gb(count: float) -> str:
    return f"{count / 1e9:,.1f} GB"


def _seconds(samples: list[float]) -> str:
    if not samples:
        return "-"
    ordered = sorted(samples)
    return (
        f"median {ordered[len(ordered) // 2]:.2f} s, max {ordered[-1]:.2f} s, "
        f"{sum(ordered):.1f} s in all"
    )


def _sizes_json(sizes: Sizes) -> dict[str, Any]:
    return {name: asdict(size) for name, size in sizes.items()}
