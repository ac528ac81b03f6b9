"""A process's ``/metrics`` read as Prometheus reads it, and a histogram's quantiles as
``histogram_quantile`` estimates them: linear within the bucket the rank falls in.

The relay exports ``expiry_event_commit_to_confirm_seconds`` (from each expiry's commit,
``expired_at`` by the database's clock, to its event's confirm by the broker;
``service/adapters/telemetry/relay_metrics.py``): the benchmark reads the latency from
there, the service's own measurement, cumulative since the relay started.
"""

from __future__ import annotations

import asyncio
import math
import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

COMMIT_TO_CONFIRM = "expiry_event_commit_to_confirm_seconds"
BATCH_DURATION = "expiry_relay_batch_duration_seconds"
SCRAPE_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class Histogram:
    """One histogram's cumulative buckets (upper bound, count at or below it), sum, count."""

    buckets: tuple[tuple[float, float], ...]  # ascending, +Inf last
    sum: float
    count: float

    def quantile(self, q: float) -> float:
        """The ``q`` quantile, linear within its bucket (the first bucket from 0); the
        highest finite bound if it falls in the +Inf bucket; 0 when empty."""
        if self.count <= 0:
            return 0.0
        rank = q * self.count
        low, below = 0.0, 0.0
        for bound, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(bound):
                    return low
                inside = cumulative - below
                return low + (bound - low) * ((rank - below) / inside if inside else 1.0)
            low, below = bound, cumulative
        return low

    def share_within(self, bound: float) -> float:
        """The share of the values at or below ``bound`` (one of the bucket bounds)."""
        for upper, cumulative in self.buckets:
            if upper == bound:
                return cumulative / self.count if self.count else 1.0
        raise ValueError(f"{bound} is not a bucket bound of the histogram")

    def plus(self, other: Histogram) -> Histogram:
        """Both processes' values (the same bounds, or ``other`` empty)."""
        theirs = dict(other.buckets)
        return Histogram(
            tuple((b, c + theirs.get(b, 0.0)) for b, c in self.buckets),
            self.sum + other.sum,
            self.count + other.count,
        )

    def minus(self, earlier: Histogram) -> Histogram:
        """What was recorded since ``earlier`` (a scrape of the same process)."""
        before = dict(earlier.buckets)
        return Histogram(
            tuple((b, c - before.get(b, 0.0)) for b, c in self.buckets),
            self.sum - earlier.sum,
            self.count - earlier.count,
        )


EMPTY = Histogram(((math.inf, 0.0),), 0.0, 0.0)


def histogram(text: str, name: str) -> Histogram:
    """Histogram ``name`` in a scrape's text, its series added up (EMPTY if absent)."""
    buckets: dict[float, float] = {}
    total = count = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.name == f"{name}_bucket":
                bound = float(sample.labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + sample.value
            elif sample.name == f"{name}_sum":
                total += sample.value
            elif sample.name == f"{name}_count":
                count += sample.value
    if not buckets:
        return EMPTY
    return Histogram(tuple(sorted(buckets.items())), total, count)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_SECONDS) as answer:
        body: bytes = answer.read()
    return body.decode()


async def scrape(port: int) -> str:
    """The text of ``http://127.0.0.1:<port>/metrics``."""
    return await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics")
