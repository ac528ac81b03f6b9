"""Histograms a Prometheus scrape reads, aggregated here at the cost of a counter.

The OpenTelemetry SDK records a histogram value in about 10 µs (its attributes
cleaned and hashed twice, a measurement object, locks, an exemplar check), and
has no call that takes values in bulk. The consumer records two or three values
per delivery: at thousands a second that was a tenth of its time. When
Prometheus is the only reader (``EXPIRY_HTTP_PORT``, the default), the
consumer's histograms are ``LocalHistogram``s instead: a value is a bucket
count, a sum and a count added under a lock (under a microsecond), and
``HistogramCollector`` shows them on ``/metrics`` exactly as the
OpenTelemetry exporter showed the SDK's (the same names, ``le`` bounds,
labels, scope labels and help text: ``tests/unit/test_histograms.py`` compares
the two texts). Pushed by OTLP, the SDK's instruments are kept.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, chain
from typing import Protocol

from opentelemetry.metrics import Meter
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

# OpenTelemetry units as the Prometheus exporter names them (the only ones used here).
_UNITS = {"s": "seconds"}


class Records(Protocol):
    """What records a histogram value: the SDK's instrument, or a ``LocalHistogram``."""

    def record(self, amount: float, attributes: Mapping[str, str] | None = None) -> None: ...


@dataclass
class _Series:
    """One attribute set's bucket counts (the last one past every bound) and sum."""

    counts: list[int]
    total: float = 0.0


@dataclass(eq=False)
class LocalHistogram:
    """A cumulative explicit-bucket histogram, as the SDK aggregates one (a value goes
    in the first bucket whose bound is at least the value)."""

    name: str
    unit: str
    description: str
    boundaries: Sequence[float]
    _series: dict[tuple[tuple[str, str], ...], _Series] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, amount: float, attributes: Mapping[str, str] | None = None) -> None:
        key = tuple(attributes.items()) if attributes else ()
        bucket = bisect.bisect_left(self.boundaries, amount)
        with self._lock:
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = _Series([0] * (len(self.boundaries) + 1))
            series.counts[bucket] += 1
            series.total += amount

    def snapshot(self) -> list[tuple[dict[str, str], list[int], float]]:
        """Each attribute set's labels, bucket counts and sum, as they stand."""
        with self._lock:
            return [(dict(key), list(s.counts), s.total) for key, s in self._series.items()]


@dataclass(eq=False)
class HistogramCollector(Collector):
    """Shows ``LocalHistogram``s to a Prometheus registry as the OpenTelemetry exporter
    shows the SDK's: ``scope`` is the labels it gives the meter's instrumentation scope."""

    histograms: Sequence[LocalHistogram]
    scope: Mapping[str, str]

    def collect(self) -> Iterator[Metric]:
        for histogram in self.histograms:
            yield from self._family(histogram)

    def _family(self, histogram: LocalHistogram) -> Iterable[Metric]:
        points = histogram.snapshot()
        if not points:
            return  # like the SDK's: no family before its first value
        keys = sorted(set(self.scope).union(*(labels for labels, _, _ in points)))
        family = HistogramMetricFamily(
            histogram.name.replace(".", "_"),
            histogram.description,
            labels=keys,
            unit=_UNITS.get(histogram.unit, histogram.unit),
        )
        bounds = [f"{bound}" for bound in chain(histogram.boundaries, ["+Inf"])]
        for labels, counts, total in points:
            row = {**labels, **self.scope}
            family.add_metric(
                [row.get(key, "") for key in keys],
                buckets=list(zip(bounds, accumulate(counts), strict=True)),
                sum_value=total,
            )
        yield family


def scope_labels(name: str, version: str | None, schema_url: str | None) -> dict[str, str]:
    """The labels the exporter gives a meter's instrumentation scope."""
    return {
        "otel_scope_name": name,
        "otel_scope_schema_url": schema_url or "",
        "otel_scope_version": version or "",
    }


# A histogram's name, unit, description and bucket bounds.
Spec = tuple[str, str, str, tuple[float, ...]]


class Histograms:
    """One process's histograms, made from ``specs``: ``LocalHistogram``s shown in
    ``prometheus`` when it is given (the registry a scrape reads, when Prometheus is the
    only reader), else the SDK's instruments. ``recorders`` follow ``specs``' order;
    ``close`` takes the local ones back out of the registry."""

    def __init__(
        self, meter: Meter, specs: Sequence[Spec], prometheus: CollectorRegistry | None
    ) -> None:
        self._served: tuple[CollectorRegistry, HistogramCollector] | None = None
        self.recorders: list[Records]
        if prometheus is None:
            self.recorders = [
                meter.create_histogram(
                    name, unit=unit, description=text, explicit_bucket_boundaries_advisory=b
                )
                for name, unit, text, b in specs
            ]
            return
        local = [LocalHistogram(*spec) for spec in specs]
        collector = HistogramCollector(
            local, scope_labels(meter.name, meter.version, meter.schema_url)
        )
        prometheus.register(collector)
        self._served = (prometheus, collector)
        self.recorders = list(local)

    def close(self) -> None:
        """Take the histograms aggregated here back out of the registry they were shown in."""
        if self._served is not None:
            registry, collector = self._served
            registry.unregister(collector)
            self._served = None
