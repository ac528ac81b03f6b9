"""Figures (samples over repetitions), the issue's targets, and how they are printed."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

UNIT_FORMATS = {
    "/s": "{:,.0f}",
    "holds": "{:,.0f}",
    "spans": "{:,.0f}",
    "events": "{:,.0f}",
    "s": "{:.2f}",
    "ms": "{:,.0f}",
    "MB": "{:.0f}",
    "%": "{:.0f}",
    "us": "{:,.0f}",
    "cores": "{:.2f}",
    "B": "{:,.0f}",
}


@dataclass
class Figure:
    """One measured quantity and its samples (one or more per repetition)."""

    label: str
    unit: str
    samples: list[float] = field(default_factory=list)
    repetitions: list[int] = field(default_factory=list)  # the repetition of each sample

    def by_repetition(self) -> dict[int, float]:
        """The median of each repetition's samples."""
        groups: dict[int, list[float]] = {}
        for repetition, value in zip(self.repetitions, self.samples, strict=True):
            groups.setdefault(repetition, []).append(value)
        return {repetition: statistics.median(values) for repetition, values in groups.items()}

    def stats(self) -> tuple[float, float, float]:
        """(min, median, max) of the samples."""
        return min(self.samples), statistics.median(self.samples), max(self.samples)

    def format(self, value: float) -> str:
        return UNIT_FORMATS[self.unit].format(value)


class Results:
    """Every figure of the run, in the order it was first measured."""

    def __init__(self) -> None:
        self.figures: dict[str, Figure] = {}
        self.repetition = 1  # the repetition that samples are recorded for

    def add(self, key: str, label: str, unit: str, value: float) -> None:
        """Record one sample of figure ``key`` in the current repetition."""
        figure = self.figures.setdefault(key, Figure(label, unit))
        figure.samples.append(value)
        figure.repetitions.append(self.repetition)

    def ratios(self, top: str, bottom: str) -> list[float]:
        """``top / bottom`` in each repetition that measured both (neighbours in time)."""
        if top not in self.figures or bottom not in self.figures:
            return []
        a, b = self.figures[top].by_repetition(), self.figures[bottom].by_repetition()
        return [a[r] / b[r] for r in sorted(a.keys() & b.keys()) if b[r]]

    def median(self, key: str) -> float | None:
        """The median of figure ``key``, or ``None`` if it was not measured."""
        figure = self.figures.get(key)
        return figure.stats()[1] if figure and figure.samples else None

    def as_json(self) -> dict[str, Any]:
        return {
            key: {
                "label": fig.label.strip(),
                "unit": fig.unit,
                "samples": fig.samples,
                "repetitions": fig.repetitions,
                "min": fig.stats()[0],
                "median": fig.stats()[1],
                "max": fig.stats()[2],
            }
            for key, fig in self.figures.items()
        }


@dataclass(frozen=True)
class Check:
    """One target of the issue, judged on the median over the repetitions."""

    what: str
    measured: str
    target: str
    met: bool | None  # None: not measured in this run


def ratio(results: Results, top: str, bottom: str) -> list[float]:
    """(median, min, max) of the per-repetition ratios ``top / bottom``; empty if unmeasured."""
    values = results.ratios(top, bottom)
    return [statistics.median(values), min(values), max(values)] if values else []


def show_ratio(values: list[float], *, times: bool = False) -> str:
    """``3.56x (3.1-4.0x)`` or ``74% (52-80%)``: the median, then the range."""
    if not values:
        return "n/a"
    mid, low, high = values
    if times:
        return f"{mid:.2f}x ({low:.1f}-{high:.1f}x)"
    return f"{mid:.0%} ({low * 100:.0f}-{high:.0%})"


def ratio_check(
    results: Results, what: str, top: str, bottom: str, at_least: float, *, times: bool = False
) -> Check:
    """The median over the repetitions of ``top / bottom`` is at least ``at_least``."""
    values = ratio(results, top, bottom)
    shown = f">= {at_least:g}x" if times else f">= {at_least:.0%}"
    if not values:
        return Check(what, "n/a", shown, None)
    return Check(what, show_ratio(values, times=times), shown, values[0] >= at_least)


def below_check(results: Results, what: str, key: str, limit: float, unit: str) -> Check:
    """``median(key) < limit``."""
    value = results.median(key)
    if value is None:
        return Check(what, "n/a", f"< {limit:g} {unit}", None)
    return Check(what, f"{value:.2f} {unit}", f"< {limit:g} {unit}", value < limit)


def figure_table(results: Results) -> list[str]:
    """The figures: label, unit, min / median / max."""
    width = max((len(fig.label) for fig in results.figures.values()), default=10)
    lines = [f"  {'figure':<{width}}  {'unit':>5}  {'min':>9}  {'median':>9}  {'max':>9}  n"]
    for fig in results.figures.values():
        low, mid, high = (fig.format(value) for value in fig.stats())
        lines.append(
            f"  {fig.label:<{width}}  {fig.unit:>5}  {low:>9}  {mid:>9}  {high:>9}  "
            f"{len(fig.samples)}"
        )
    return lines


def check_table(checks: list[Check]) -> list[str]:
    """The targets: met / NOT MET / n/a, the measured value and the target."""
    width = max(len(check.what) for check in checks)
    lines = []
    for check in checks:
        verdict = {True: "met", False: "NOT MET", None: "n/a"}[check.met]
        lines.append(
            f"  [{verdict:^7}] {check.what:<{width}}  {check.measured:>20}  (target {check.target})"
        )
    return lines


def markdown_table(results: Results) -> list[str]:
    """The figures as a Markdown table (for docs/benchmark.md)."""
    lines = ["| figure | unit | min | median | max |", "|---|---|---:|---:|---:|"]
    for fig in results.figures.values():
        low, mid, high = (fig.format(value) for value in fig.stats())
        label = f"· {fig.label.strip()}" if fig.label.startswith(" ") else fig.label
        lines.append(f"| {label} | {fig.unit} | {low} | {mid} | {high} |")
    return lines


def markdown_checks(checks: list[Check]) -> list[str]:
    """The targets as a Markdown table."""
    lines = ["| target | measured | target | met |", "|---|---:|---|---|"]
    for check in checks:
        verdict = {True: "yes", False: "**no**", None: "n/a"}[check.met]
        lines.append(f"| {check.what} | {check.measured} | {check.target} | {verdict} |")
    return lines
