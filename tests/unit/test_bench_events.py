"""The events' figures of ``python -m bench``: the relay's histogram read as Prometheus
reads it, its rate from its marks, and the three targets of issue 37."""

from __future__ import annotations

import math

import pytest

from bench.config import Options
from bench.outbox import RelayRate
from bench.report import Results
from bench.scrape import COMMIT_TO_CONFIRM, Histogram, histogram
from bench.targets import event_targets, other_ratios

SCRAPE = """\
# HELP expiry_event_commit_to_confirm_seconds From an expiry's commit to its confirm
# TYPE expiry_event_commit_to_confirm_seconds histogram
expiry_event_commit_to_confirm_seconds_bucket{le="0.01",otel_scope_name="service"} 10.0
expiry_event_commit_to_confirm_seconds_bucket{le="0.1",otel_scope_name="service"} 90.0
expiry_event_commit_to_confirm_seconds_bucket{le="0.25",otel_scope_name="service"} 99.0
expiry_event_commit_to_confirm_seconds_bucket{le="+Inf",otel_scope_name="service"} 100.0
expiry_event_commit_to_confirm_seconds_count{otel_scope_name="service"} 100.0
expiry_event_commit_to_confirm_seconds_sum{otel_scope_name="service"} 6.5
"""


def test_a_histogram_is_read_from_the_scrape_and_its_quantiles_interpolated() -> None:
    found = histogram(SCRAPE, COMMIT_TO_CONFIRM)

    assert found.count == 100
    assert found.sum == pytest.approx(6.5)
    assert found.buckets[-1] == (math.inf, 100.0)
    # p50: rank 50 in (0.01, 0.1], 40 of its 80 in: halfway
    assert found.quantile(0.5) == pytest.approx(0.055)
    # p99: rank 99, the top of (0.1, 0.25]
    assert found.quantile(0.99) == pytest.approx(0.25)
    assert found.share_within(0.25) == pytest.approx(0.99)
    # in the +Inf bucket: the highest finite bound
    assert found.quantile(0.999) == pytest.approx(0.25)


def test_an_absent_histogram_is_empty_and_scrapes_subtract_and_add_up() -> None:
    assert histogram(SCRAPE, "nothing_here").count == 0
    assert histogram(SCRAPE, "nothing_here").quantile(0.99) == 0.0
    later = Histogram(((0.1, 30.0), (math.inf, 40.0)), 5.0, 40.0)
    earlier = Histogram(((0.1, 10.0), (math.inf, 10.0)), 1.0, 10.0)

    since = later.minus(earlier)

    assert since.buckets == ((0.1, 20.0), (math.inf, 30.0))
    assert (since.sum, since.count) == (4.0, 30.0)
    both = later.plus(earlier)  # two relays' histograms, added up
    assert both.buckets == ((0.1, 40.0), (math.inf, 50.0))
    assert (both.sum, both.count) == (6.0, 50.0)


def test_the_relays_rate_leaves_out_the_first_batch() -> None:
    # 4 marks of 500 over 0.3 s: the first batch was published before the first mark
    assert RelayRate(4, 2000, 0.3, 500).rate == pytest.approx(5000)
    assert RelayRate(1, 500, 0.0, 500).rate == 0.0
    assert RelayRate(0, 0, 0.0).rate == 0.0


def _options() -> Options:
    return Options(20_000, 3, (1, 2), 2_000, 20.0, 100_000, 1.0, False, None)


def test_the_event_targets_are_judged_within_each_repetition() -> None:
    results = Results()
    for repetition, (on, off, relay, two, within, p99) in enumerate(
        [(900, 1000, 7000, 6000, 99.6, 240.0), (800, 1000, 5000, 6000, 98.6, 300.0)], 1
    ):
        results.repetition = repetition
        results.add("e2e.events_on", "on", "/s", on)
        results.add("e2e.events_off", "off", "/s", off)
        results.add("relay.beside", "relay", "/s", relay)
        results.add("e2e.relay_consumers", "two", "/s", two)
        results.add("events.within", "within", "%", within)
        results.add("events.mark_p99", "p99", "ms", p99)

    on_off, beside, latency = event_targets(results, _options())

    assert (on_off.measured, on_off.met) == ("85% (80-90%)", True)
    assert beside.met is True  # median of 117% and 83%: 100%
    # the median share within 250 ms, 99.1%; the exact p99 to the mark beside it
    assert latency.measured == "99.1% (mark p99 270 ms)"
    assert latency.target == "<= 250 ms: >= 99% within"
    assert latency.met is True


def test_unmeasured_event_targets_are_not_judged() -> None:
    checks = event_targets(Results(), _options())

    assert [check.met for check in checks] == [None, None, None]
    shown = dict(other_ratios(Results()))
    assert shown["relay alone (a full outbox) vs raw publish with confirms"] == "n/a"
