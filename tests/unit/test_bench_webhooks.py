"""The webhooks' figures of ``python -m bench``: the receiver reads a request's head, the
endpoint the deliverers are given is one the service accepts, and the ratios are shown."""

from __future__ import annotations

import pytest

from bench.receiver import head_of
from bench.report import Results
from bench.targets import other_ratios
from bench.webhook_runs import RATE_OFF, Received, endpoint_env
from service.settings.endpoints import parse_endpoints

HEAD = (
    b"POST /hook HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nContent-Length: 42\r\n"
    b"webhook-id: expired:abc:123\r\ncontent-type: application/json"
)


def test_the_receiver_reads_the_length_and_the_webhook_id() -> None:
    assert head_of(HEAD) == (42, b"expired:abc:123")
    assert head_of(b"POST / HTTP/1.1\r\ncontent-length: 0") == (0, b"")


@pytest.mark.parametrize(
    "head",
    [
        b"POST / HTTP/1.1\r\nhost: x",  # no length
        b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\ncontent-length: 3",
        b"POST / HTTP/1.1\r\ncontent-length: many",
        b"POST / HTTP/1.1\r\nno colon here\r\ncontent-length: 3",
    ],
)
def test_a_head_the_receiver_cannot_read_is_refused(head: bytes) -> None:
    assert head_of(head) is None


def test_the_deliverers_endpoint_is_accepted_by_the_service() -> None:
    (endpoint,) = parse_endpoints(endpoint_env(8123)["EXPIRY_WEBHOOKS"])

    assert endpoint.url == "http://127.0.0.1:8123/hook"
    assert endpoint.rate_per_second == RATE_OFF
    assert endpoint.plain_http


def test_the_delivery_rate_counts_each_delivery_once() -> None:
    received = Received(requests=1_002, distinct=1_000, invalid=0, seconds=4.0)

    assert received.rate == pytest.approx(250.0)
    assert received.repeats == 2
    assert Received(1, 1, 0, 0.0).rate == 0.0


def test_the_webhooks_ratios_are_within_each_repetition() -> None:
    results = Results()
    for repetition, (one, none, k1, k2) in enumerate(
        [(900, 1000, 200, 300), (800, 1000, 200, 200)], 1
    ):
        results.repetition = repetition
        results.add("e2e.webhooks_one", "one", "/s", one)
        results.add("e2e.webhooks_none", "none", "/s", none)
        results.add("webhooks.k1", "k1", "/s", k1)
        results.add("webhooks.k2", "k2", "/s", k2)

    shown = dict(other_ratios(results))

    assert shown["1 consumer, events on, one endpoint registered vs none"] == "85% (80-90%)"
    assert shown["webhooks: 2 deliverers vs 1, deliveries/s"] == "125% (100-150%)"
