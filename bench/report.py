"""Figures (samples over repetitions), the issue's targets, and how they are printed."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

UNIT_FORMATS = {
    "/s": "{:,.0f}",
    "s": "{:.2f}",
    "MB": "{:.0f}",
    "%": "{:.0f}",
    "us": "{:,.0f}",
    "cores": "{:.2f}",
}


@dataclass
class Figure:
    """One measured quantity and its samples, one per repetition."""

    label: str
    unit: str
    samples: list[float] = field(default_factory=list)

    def stats(self) -> tuple[float, float, float]:
        """(min, median, max) of the samples."""
        return min(self.samples), statistics.median(self.samples), max(self.samples)

    def format(self, value: float) -> str:
        return UNIT_FORMATS[self.unit].format(value)


class Results:
    """Every figure of the run, in the order it was first measured."""

    def __init__(self) -> None:
        self.figures: dict[str, Figure] = {}

    def add(self, key: str, label: str, unit: str, value: float) -> None:
        """Record one sample of figure ``key``."""
        self.figures.setdefault(key, Figure(label, unit)).samples.append(value)

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
                "min": fig.stats()[0],
                "median": fig.stats()[1],
                "max": fig.stats()[2],
            }
            for key, fig in self.figures.items()
        }


@dataclass(frozen=True)
class Check:
    """One target of the issue, against the medians of this run."""

    what: str
    measured: str
    target: str
    met: bool | None  # None: not measured in this run


def ratio(results: Results, top: str, bottom: str) -> float | None:
    """``median(top) / median(bottom)``, or ``None`` if either is missing."""
    a, b = results.median(top), results.median(bottom)
    return a / b if a is not None and b else None


def ratio_check(
    results: Results, what: str, top: str, bottom: str, at_least: float, *, times: bool = False
) -> Check:
    """``median(top) / median(bottom) >= at_least``, shown as ``6.1x`` or ``83%``."""
    value = ratio(results, top, bottom)
    shown = f">= {at_least:g}x" if times else f">= {at_least:.0%}"
    if value is None:
        return Check(what, "n/a", shown, None)
    return Check(what, f"{value:.2f}x" if times else f"{value:.0%}", shown, value >= at_least)


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
            f"  [{verdict:^7}] {check.what:<{width}}  {check.measured:>9}  (target {check.target})"
        )
    return lines


def markdown_table(results: Results) -> list[str]:
    """The figures as a Markdown table (for docs/benchmark.md)."""
    lines = ["| figure | unit | min | median | max |", "|---|---|---:|---:|---:|"]
    for fig in results.figures.values():
        low, mid, high = (fig.format(value) for value in fig.stats())
        lines.append(f"| {fig.label} | {fig.unit} | {low} | {mid} | {high} |")
    return lines


def markdown_checks(checks: list[Check]) -> list[str]:
    """The targets as a Markdown table."""
    lines = ["| target | measured | target | met |", "|---|---:|---|---|"]
    for check in checks:
        verdict = {True: "yes", False: "**no**", None: "n/a"}[check.met]
        lines.append(f"| {check.what} | {check.measured} | {check.target} | {verdict} |")
    return lines
