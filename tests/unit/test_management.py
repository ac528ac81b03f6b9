"""Unit tests for the management API reading: where it is, and how what it says differs."""

from __future__ import annotations

from typing import Any

import pytest

from service.adapters.amqp import management
from service.adapters.amqp.management import Drift, Observed, drift, endpoint_for, parse_observed
from service.core import topology
from service.settings import Settings

TOPOLOGY = topology.build_topology((1, 5))


def _settings(amqp_url: str, management_url: str | None = None) -> Settings:
    return Settings(amqp_url=tuple(amqp_url.split(",")), management_url=management_url)


def _as_shipped() -> dict[str, list[dict[str, Any]]]:
    """What the management API answers for a vhost holding exactly the topology."""
    declared = topology.definitions(TOPOLOGY, vhost="v")
    for exchange in declared["exchanges"]:
        exchange.pop("vhost")
    for queue in declared["queues"]:
        queue.pop("vhost")
    default_bindings = [
        {
            "source": "",
            "destination": q["name"],
            "destination_type": "queue",
            "routing_key": q["name"],
        }
        for q in declared["queues"]
    ]
    declared["bindings"] = default_bindings + declared["bindings"]
    return declared


def _observed(answer: dict[str, list[dict[str, Any]]]) -> Observed:
    return parse_observed(answer["queues"], answer["exchanges"], answer["bindings"])


def test_default_endpoint_is_beside_the_first_node_with_its_credentials_and_vhost() -> None:
    """No EXPIRY_MANAGEMENT_URL: http, the first node's host, port 15672, its user and vhost."""
    settings = _settings(
        "amqp://svc:p%40ss@rabbit1:5672/orders,amqp://svc:p%40ss@rabbit2:5672/orders"
    )
    endpoint = endpoint_for(settings)
    assert endpoint.base == "http://rabbit1:15672"
    assert (endpoint.user, endpoint.password, endpoint.vhost) == ("svc", "p@ss", "orders")
    assert endpoint.url("queues", "name") == "http://rabbit1:15672/api/queues/orders?columns=name"


@pytest.mark.parametrize(
    ("amqp_url", "vhost"),
    [
        ("amqp://h/", "/"),
        ("amqp://h", "/"),
        ("amqp://h/%2F", "/"),
        ("amqp://h/a%2Fb", "a/b"),
        ("amqp://h/expiry-t-1", "expiry-t-1"),
    ],
)
def test_the_vhost_is_the_amqp_urls_as_the_client_reads_it(amqp_url: str, vhost: str) -> None:
    """The vhost part of AMQP_URL, percent-decoded; none or a bare slash means ``/``."""
    endpoint = endpoint_for(_settings(amqp_url))
    assert endpoint.vhost == vhost
    assert (endpoint.user, endpoint.password) == ("guest", "guest")


def test_an_explicit_url_without_credentials_uses_the_amqp_ones() -> None:
    """EXPIRY_MANAGEMENT_URL names where the API is; the AMQP URL's user logs in."""
    endpoint = endpoint_for(
        _settings("amqp://svc:pw@h:5673/v", "https://mgmt.example:8443/rabbit/")
    )
    assert endpoint.base == "https://mgmt.example:8443/rabbit"
    assert (endpoint.user, endpoint.password, endpoint.vhost) == ("svc", "pw", "v")


def test_an_explicit_url_with_credentials_uses_them() -> None:
    """Credentials in EXPIRY_MANAGEMENT_URL win, and stay out of ``base``."""
    endpoint = endpoint_for(_settings("amqp://svc:pw@h/v", "http://watch:s%3Acret@[::1]:15673"))
    assert endpoint.base == "http://[::1]:15673"
    assert (endpoint.user, endpoint.password) == ("watch", "s:cret")
    assert endpoint.authorization == "Basic d2F0Y2g6czpjcmV0"


def test_the_declared_topology_shows_no_drift() -> None:
    """The answers for a vhost holding the topology (and the default bindings) agree."""
    assert drift(TOPOLOGY, _observed(_as_shipped())) is None


def test_other_queues_and_bindings_in_the_vhost_are_not_drift() -> None:
    """Queues and bindings that are not the service's are left alone."""
    answer = _as_shipped()
    answer["queues"].append({"name": "other", "durable": False, "auto_delete": True})
    answer["bindings"].append(
        {
            "source": "expirations",
            "destination": "other",
            "destination_type": "queue",
            "routing_key": "x",
        }
    )
    assert drift(TOPOLOGY, _observed(answer)) is None


def _queue(answer: dict[str, list[dict[str, Any]]], name: str) -> dict[str, Any]:
    [found] = [q for q in answer["queues"] if q["name"] == name]
    return found


def test_a_different_missing_or_extra_argument_is_drift() -> None:
    """Each argument that differs is named, in name order, with what was expected."""
    answer = _as_shipped()
    arguments = _queue(answer, "expirations")["arguments"]
    arguments["x-delivery-limit"] = 5
    del arguments["x-dead-letter-exchange"]
    arguments["x-max-length"] = 100
    assert drift(TOPOLOGY, _observed(answer)) == Drift(
        "queue 'expirations'",
        (
            "x-dead-letter-exchange missing, expected 'expirations.dead'",
            "x-delivery-limit=5, expected 10",
            "x-max-length=100, not expected",
        ),
    )


def test_a_value_of_another_type_is_drift() -> None:
    """``"10"`` (a string) is not the integer 10, nor is ``true`` the integer 1."""
    answer = _as_shipped()
    _queue(answer, "expirations.dead")["arguments"]["x-delivery-limit"] = "1000"
    found = drift(TOPOLOGY, _observed(answer))
    assert found == Drift("queue 'expirations.dead'", ("x-delivery-limit='1000', expected 1000",))
    assert management.argument_details({"x-a": 1}, {"x-a": True}) == ("x-a=True, expected 1",)


def test_a_missing_binding_is_drift() -> None:
    """Each routing key the queue must be bound with is checked."""
    answer = _as_shipped()
    answer["bindings"] = [
        b
        for b in answer["bindings"]
        if (b["destination"], b["routing_key"]) != ("expirations.dead", "dead")
    ]
    assert drift(TOPOLOGY, _observed(answer)) == Drift(
        "queue 'expirations.dead'", ("not bound to exchange 'expirations.dead' with 'dead'",)
    )


def test_an_exchange_of_another_type_or_durability_is_drift_and_comes_first() -> None:
    """Exchanges are compared before queues: type, durable, auto-delete, internal, arguments."""
    answer = _as_shipped()
    answer["exchanges"][1].update(type="topic", durable=False)
    _queue(answer, "expirations")["arguments"]["x-delivery-limit"] = 5
    assert drift(TOPOLOGY, _observed(answer)) == Drift(
        "exchange 'expirations.retry'",
        ("type='topic', expected 'direct'", "durable=False, expected True"),
    )


def test_an_object_the_api_does_not_list_is_left_to_the_existence_check() -> None:
    """Not listed (the API's view may lag): not judged; the passive declare showed it exists."""
    answer = _as_shipped()
    answer["queues"] = [q for q in answer["queues"] if q["name"] != "expirations.dead.log"]
    answer["exchanges"] = [e for e in answer["exchanges"] if e["name"] != "expirations.retry"]
    assert drift(TOPOLOGY, _observed(answer)) is None


def test_a_non_durable_queue_is_drift() -> None:
    """A queue that would not survive a restart differs, whatever its arguments."""
    answer = _as_shipped()
    _queue(answer, topology.retry_queue(5))["durable"] = False
    found = drift(TOPOLOGY, _observed(answer))
    assert found == Drift("queue 'expirations.retry.5s'", ("durable=False, expected True",))


@pytest.mark.parametrize("queues", [None, [1, 2], [{"no-name": 1}], "text"])
def test_a_malformed_answer_is_a_value_error(queues: Any) -> None:
    """An answer that is not a list of objects with names is refused, not half-read."""
    with pytest.raises(ValueError, match="unexpected answer"):
        parse_observed(queues, [], [])
