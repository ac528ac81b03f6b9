"""Unit tests for the management API: where it is, how what it says differs, and the client."""

from __future__ import annotations

import base64
import json
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from service.adapters.amqp import management
from service.adapters.amqp.management import (
    Drift,
    Management,
    ManagementUnavailable,
    Observed,
    drift,
    endpoint_for,
    parse_observed,
)
from service.core import topology
from service.settings import Settings
from tests.tls.certs import make_certs

TOPOLOGY = topology.build_topology((1, 5), jitter=0.0, slots=1)


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
    assert endpoint.client().base == "http://rabbit1:15672"


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
    assert endpoint.client().authorization == "Basic d2F0Y2g6czpjcmV0"


def test_beside_an_amqps_node_the_api_is_https_checked_with_the_urls_files(
    tmp_path: Path,
) -> None:
    """An amqps:// first node: https on port 15671, checked with AMQP_URL's cafile and
    its client certificate; EXPIRY_MANAGEMENT_CA_FILE and _CERT_FILE win over them."""
    certs = make_certs(tmp_path)
    client = certs.external_client
    query = f"cafile={certs.ca}&certfile={client.cert}&keyfile={client.key}"
    endpoint = endpoint_for(_settings(f"amqps://svc:pw@rabbit1:5671/v?{query}"))
    assert endpoint.base == "https://rabbit1:15671"
    assert endpoint.tls == management.TlsFiles(str(certs.ca), str(client.cert), str(client.key))
    assert endpoint.tls.context().verify_mode == ssl.CERT_REQUIRED
    own = Settings(
        amqp_url=(f"amqps://svc:pw@rabbit1:5671/v?{query}",),
        management_ca_file=str(certs.wrong_ca),
        management_cert_file=str(certs.postgres_client.cert),
        management_key_file=str(certs.postgres_client.key),
    )
    assert endpoint_for(own).tls == management.TlsFiles(
        str(certs.wrong_ca), str(certs.postgres_client.cert), str(certs.postgres_client.key)
    )
    assert endpoint_for(_settings("amqp://h/")).tls == management.TlsFiles()


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
    _queue(answer, topology.delay_queue(5000))["durable"] = False
    found = drift(TOPOLOGY, _observed(answer))
    assert found == Drift("queue 'expirations.retry.5s'", ("durable=False, expected True",))


@pytest.mark.parametrize("queues", [None, [1, 2], [{"no-name": 1}], "text"])
def test_a_malformed_answer_is_a_value_error(queues: Any) -> None:
    """An answer that is not a list of objects with names is refused, not half-read."""
    with pytest.raises(ValueError, match="unexpected answer"):
        parse_observed(queues, [], [])


# -- the client, against a local stand-in for the API ------------------------------------


@dataclass
class Call:
    """One request the stand-in received."""

    method: str
    path: str
    authorization: str
    body: Any


class _StandIn(BaseHTTPRequestHandler):
    """Answers from ``ANSWERS`` (path -> status, body); records every call in ``CALLS``."""

    answers: ClassVar[dict[str, tuple[int, bytes]]] = {}
    calls: ClassVar[list[Call]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.calls.append(Call(self.command, self.path, self.headers["authorization"], body))
        status, text = self.answers.get(self.path, (204, b""))
        self.send_response(status)
        self.send_header("content-length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    do_GET = do_PUT = do_DELETE = do_POST = _answer

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@pytest.fixture
def stand_in() -> Iterator[str]:
    """A local HTTP server standing in for the management API; its base URL."""
    _StandIn.answers, _StandIn.calls = {}, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StandIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://admin:s%3Acret@127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


async def test_the_client_logs_in_with_the_urls_credentials_and_quotes_names(
    stand_in: str,
) -> None:
    """A vhost is created with a JSON body, then the AMQP user is given every permission."""
    client = Management(stand_in)
    await client.create_vhost("a/b", "svc")
    put_vhost, put_permissions = _StandIn.calls
    assert (put_vhost.method, put_vhost.path, put_vhost.body) == ("PUT", "/api/vhosts/a%2Fb", {})
    assert put_vhost.authorization == "Basic " + base64.b64encode(b"admin:s:cret").decode()
    assert put_permissions.path == "/api/permissions/a%2Fb/svc"
    assert put_permissions.body == {"configure": ".*", "write": ".*", "read": ".*"}


async def test_the_client_reads_json_and_passes_columns(stand_in: str) -> None:
    """A GET answers parsed JSON; ``columns`` goes in the query as given."""
    _StandIn.answers["/api/queues/v?columns=name"] = (200, b'[{"name": "b"}, {"name": "a"}]')
    assert await Management(stand_in).queue_names("v") == ["a", "b"]


async def test_a_refusal_carries_its_http_status(stand_in: str) -> None:
    """HTTP 404: ``ManagementUnavailable`` with the status and the request in its message."""
    _StandIn.answers["/api/queues/v/q"] = (404, b'{"error": "Object Not Found"}')
    with pytest.raises(ManagementUnavailable) as caught:
        await Management(stand_in).queue("v", "q")
    assert caught.value.status == 404
    assert str(caught.value) == "GET /api/queues/v/q: HTTP 404 Not Found"


async def test_an_answer_that_is_not_json_is_unavailable(stand_in: str) -> None:
    """An answer that does not parse is not half-read."""
    _StandIn.answers["/api/overview"] = (200, b"<html>")
    with pytest.raises(ManagementUnavailable, match=r"^GET /api/overview: the answer is not JSON$"):
        await Management(stand_in).request("GET", "/overview")


async def test_an_unreachable_api_is_unavailable() -> None:
    """Nothing listens: ``ManagementUnavailable`` saying so, without a status."""
    with pytest.raises(ManagementUnavailable, match="unreachable") as caught:
        await Management("http://127.0.0.1:1", timeout=2).delete_vhost("v")
    assert caught.value.status is None


async def test_closing_connections_picks_them_by_client_name(stand_in: str) -> None:
    """Only connections whose client named them ``named...`` are closed; one gone meanwhile
    (404) still counts."""
    listed = [
        {"name": "c 1", "client_properties": {"connection_name": "expiry-consume w1"}},
        {"name": "c 2", "client_properties": {"connection_name": "other"}},
        {"name": "c 3", "client_properties": {}},
    ]
    _StandIn.answers["/api/vhosts/v/connections?columns=name,client_properties"] = (
        200,
        json.dumps(listed).encode(),
    )
    _StandIn.answers["/api/connections/c%201"] = (404, b"{}")
    assert await Management(stand_in).close_connections("v", named="expiry-consume") == 1
    assert [c.path for c in _StandIn.calls if c.method == "DELETE"] == ["/api/connections/c%201"]
    assert await Management(stand_in).close_connections("v") == 3
