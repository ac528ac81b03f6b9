"""The RabbitMQ management API, read only: what it says about the topology.

Queue arguments cannot be read over AMQP (a passive declare tells only that a
queue exists), so the running processes, which may not declare, read them
here: three GETs (queues, exchanges, bindings of the vhost), standard-library
HTTP in a thread. Where the API is (``endpoint_for``), what the answers mean
(``parse_observed``) and how they differ from the topology (``drift``) are
pure.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.error import HTTPError, URLError
from urllib.parse import quote, unquote, urlsplit
from urllib.request import Request, urlopen

from service.core.topology import ExchangeSpec, QueueSpec, Topology
from service.settings import Settings

MANAGEMENT_PORT = 15672
READ_TIMEOUT_SECONDS = 5.0
QUEUE_COLUMNS = "name,durable,auto_delete,arguments"
EXCHANGE_COLUMNS = "name,type,durable,auto_delete,internal,arguments"
BINDING_COLUMNS = "source,destination,destination_type,routing_key"


class ManagementUnavailable(Exception):
    """The management API could not be read (unreachable, refused, or answered nonsense)."""


@dataclass(frozen=True)
class Endpoint:
    """Where the API is (no credentials in ``base``), whom to log in as, which vhost."""

    base: str
    user: str
    password: str
    vhost: str

    def url(self, collection: str, columns: str) -> str:
        """The URL of one of the vhost's collections, e.g. ``queues``."""
        return f"{self.base}/api/{collection}/{quote(self.vhost, safe='')}?columns={columns}"

    @property
    def authorization(self) -> str:
        """The HTTP basic ``Authorization`` header value."""
        pair = f"{self.user}:{self.password}".encode()
        return "Basic " + base64.b64encode(pair).decode()


def endpoint_for(settings: Settings) -> Endpoint:
    """``EXPIRY_MANAGEMENT_URL``, or http beside the first node of ``AMQP_URL`` (port
    15672); its own credentials if it has some, else the AMQP URL's; the AMQP URL's vhost."""
    amqp = urlsplit(settings.amqp_url[0])
    user = unquote(amqp.username) if amqp.username is not None else "guest"
    password = unquote(amqp.password) if amqp.password is not None else "guest"
    vhost = unquote(amqp.path[1:]) if len(amqp.path) > 1 else "/"
    if settings.management_url is None:
        return Endpoint(f"http://{_host(amqp.hostname)}:{MANAGEMENT_PORT}", user, password, vhost)
    given = urlsplit(settings.management_url)
    if given.username is not None:
        user, password = unquote(given.username), unquote(given.password or "")
    port = f":{given.port}" if given.port else ""
    base = f"{given.scheme}://{_host(given.hostname)}{port}{given.path.rstrip('/')}"
    return Endpoint(base, user, password, vhost)


def _host(hostname: str | None) -> str:
    host = hostname or "localhost"
    return f"[{host}]" if ":" in host else host


@dataclass(frozen=True)
class Observed:
    """The vhost's exchanges and queues by name, and its bindings to queues."""

    exchanges: Mapping[str, Mapping[str, Any]]
    queues: Mapping[str, Mapping[str, Any]]
    bindings: frozenset[tuple[str, str, str]]  # (exchange, queue, routing key)


def parse_observed(queues: Any, exchanges: Any, bindings: Any) -> Observed:
    """The three answers (parsed JSON) as ``Observed``; ``ValueError`` if malformed."""
    try:
        return Observed(
            exchanges={str(item["name"]): item for item in exchanges},
            queues={str(item["name"]): item for item in queues},
            bindings=frozenset(
                (str(b["source"]), str(b["destination"]), str(b["routing_key"]))
                for b in bindings
                if b.get("destination_type", "queue") == "queue"
            ),
        )
    except (TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"unexpected answer ({type(exc).__name__}: {exc})") from None


@dataclass(frozen=True)
class Drift:
    """One object of the topology that the broker holds otherwise."""

    what: str  # e.g. "queue 'expirations'"
    details: tuple[str, ...]  # e.g. "x-delivery-limit=5, expected 10"


def drift(topology: Topology, observed: Observed) -> Drift | None:
    """The first exchange or queue (in the topology's order) that differs, or None.

    One that the answer does not list is not judged: the passive declares showed that
    it exists, and the API's view may lag behind the broker's."""
    return next(_all_drift(topology, observed), None)


def _all_drift(topology: Topology, observed: Observed) -> Iterator[Drift]:
    for exchange in topology.exchanges:
        details = _exchange_details(exchange, observed.exchanges.get(exchange.name))
        if details:
            yield Drift(f"exchange {exchange.name!r}", details)
    for queue in topology.queues:
        details = _queue_details(queue, observed.queues.get(queue.name), observed.bindings)
        if details:
            yield Drift(f"queue {queue.name!r}", details)


def _exchange_details(spec: ExchangeSpec, seen: Mapping[str, Any] | None) -> tuple[str, ...]:
    if seen is None:  # not listed (yet): its existence is the passive declare's to tell
        return ()
    expected = {
        "type": spec.type,
        "durable": True,
        "auto_delete": False,
        "internal": False,
    }
    return (*_field_details(expected, seen), *argument_details({}, seen.get("arguments")))


def _queue_details(
    spec: QueueSpec, seen: Mapping[str, Any] | None, bindings: frozenset[tuple[str, str, str]]
) -> tuple[str, ...]:
    if seen is None:  # not listed (yet): its existence is the passive declare's to tell
        return ()
    unbound = tuple(
        f"not bound to exchange {spec.exchange!r} with {key!r}"
        for key in spec.routing_keys
        if (spec.exchange, spec.name, key) not in bindings
    )
    return (
        *_field_details({"durable": True, "auto_delete": False}, seen),
        *argument_details(spec.arguments, seen.get("arguments")),
        *unbound,
    )


def _field_details(expected: Mapping[str, Any], seen: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(
        f"{key}={seen.get(key)!r}, expected {value!r}"
        for key, value in expected.items()
        if seen.get(key) != value
    )


def argument_details(expected: Mapping[str, Any], seen: Any) -> tuple[str, ...]:
    """Each argument that is missing, extra or of another value, in name order."""
    if not isinstance(seen, Mapping):
        seen = {}
    details = []
    for key in sorted(set(expected) | set(seen)):
        if key not in seen:
            details.append(f"{key} missing, expected {expected[key]!r}")
        elif key not in expected:
            details.append(f"{key}={seen[key]!r}, not expected")
        elif not _same(seen[key], expected[key]):
            details.append(f"{key}={seen[key]!r}, expected {expected[key]!r}")
    return tuple(details)


def _same(seen: Any, expected: Any) -> bool:
    # JSON's true is not the integer 1 here.
    return type(seen) is type(expected) and bool(seen == expected)


async def read_observed(endpoint: Endpoint, timeout: float = READ_TIMEOUT_SECONDS) -> Observed:
    """Read the vhost's queues, exchanges and bindings; ``ManagementUnavailable`` if not."""
    return await asyncio.to_thread(_read_observed, endpoint, timeout)


def _read_observed(endpoint: Endpoint, timeout: float) -> Observed:
    answers = [
        _get(endpoint, collection, columns, timeout)
        for collection, columns in (
            ("queues", QUEUE_COLUMNS),
            ("exchanges", EXCHANGE_COLUMNS),
            ("bindings", BINDING_COLUMNS),
        )
    ]
    try:
        return parse_observed(*answers)
    except ValueError as exc:
        raise ManagementUnavailable(str(exc)) from None


def _get(endpoint: Endpoint, collection: str, columns: str, timeout: float) -> Any:
    request = Request(endpoint.url(collection, columns), method="GET")
    request.add_header("authorization", endpoint.authorization)
    request.add_header("accept", "application/json")
    where = f"GET /api/{collection}/{{vhost}}"
    try:
        with urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except HTTPError as exc:
        raise ManagementUnavailable(f"{where}: HTTP {exc.code} {exc.reason}") from None
    except URLError as exc:
        raise ManagementUnavailable(f"{where}: unreachable ({exc.reason})") from None
    except OSError as exc:  # a timeout, a reset
        raise ManagementUnavailable(f"{where}: {type(exc).__name__}: {exc}") from None
    except ValueError:
        raise ManagementUnavailable(f"{where}: the answer is not JSON") from None
