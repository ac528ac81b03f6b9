"""The RabbitMQ management HTTP API: the one client, and what it says about the topology.

Queue arguments cannot be read over AMQP (a passive declare tells only that a
queue exists), so the running processes, which may not declare, read them
here: three GETs (queues, exchanges, bindings of the vhost). The demo, the
benchmark and the tests use the same client (``Management``) to make and
remove vhosts, grant permissions, set policies, look at queues and close
connections. Standard-library HTTP, run in a thread. Where the API is
(``endpoint_for``), what the answers mean (``parse_observed``) and how they
differ from the topology (``drift``) are pure.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import ssl
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.error import HTTPError, URLError
from urllib.parse import quote, unquote, urlencode, urlsplit
from urllib.request import Request, urlopen

from service.core.tls_failures import tls_failure
from service.core.topology import ExchangeSpec, QueueSpec, Topology
from service.settings import Settings
from service.settings.tls_files import amqp_tls_files

MANAGEMENT_PORT = 15672
MANAGEMENT_TLS_PORT = 15671  # RabbitMQ's conventional https port for the API
READ_TIMEOUT_SECONDS = 5.0
QUEUE_COLUMNS = "name,durable,auto_delete,arguments"
EXCHANGE_COLUMNS = "name,type,durable,auto_delete,internal,arguments"
BINDING_COLUMNS = "source,destination,destination_type,routing_key"
EVERYTHING = {"configure": ".*", "write": ".*", "read": ".*"}


class ManagementUnavailable(Exception):
    """The management API could not be read (unreachable, refused, or answered nonsense)."""

    def __init__(
        self, message: str, *, status: int | None = None, tls_refused: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status of a refusal, e.g. 401 or 404
        self.tls_refused = tls_refused  # what was wrong with TLS, when that was it


@dataclass(frozen=True)
class TlsFiles:
    """The files an https:// API is checked with: a CA (None: the system's), a client
    certificate and its key (None: none)."""

    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None

    def context(self) -> ssl.SSLContext:
        """A client context that verifies the server and its host name."""
        context = ssl.create_default_context(cafile=self.cafile)
        if self.certfile is not None:
            context.load_cert_chain(self.certfile, self.keyfile)
        return context


def _name(text: str) -> str:
    return quote(text, safe="")


class Management:
    """The API at ``url``, logged in as ``user`` (default: the URL's user, else guest)."""

    def __init__(
        self,
        url: str,
        *,
        user: str | None = None,
        password: str | None = None,
        timeout: float = 30,
        tls: TlsFiles | None = None,
    ) -> None:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port else ""
        self.base = f"{parts.scheme}://{_host(parts.hostname)}{port}{parts.path.rstrip('/')}"
        self.user = user if user is not None else unquote(parts.username or "guest")
        self.password = password if password is not None else unquote(parts.password or "guest")
        self.timeout = timeout
        self._tls = tls or TlsFiles()
        self._context: ssl.SSLContext | None = None

    @property
    def authorization(self) -> str:
        """The HTTP basic ``Authorization`` header value."""
        pair = f"{self.user}:{self.password}".encode()
        return "Basic " + base64.b64encode(pair).decode()

    async def request(
        self, method: str, path: str, body: Any = None, *, label: str = "", **query: str
    ) -> Any:
        """``METHOD /api<path>``: the answer's JSON (None if empty), or ``ManagementUnavailable``
        (told as ``label``, default the method and the path)."""
        label = label or f"{method} /api{path}"
        return await asyncio.to_thread(self._send, method, path, body, label, query)

    def _send(self, method: str, path: str, body: Any, label: str, query: dict[str, str]) -> Any:
        url = f"{self.base}/api{path}" + (f"?{urlencode(query, safe=',')}" if query else "")
        data = None if body is None else json.dumps(body).encode()
        request = Request(url, data=data, method=method)
        request.add_header("authorization", self.authorization)
        if method == "GET":  # (some other answers are not JSON: HTTP 406 when asked for it)
            request.add_header("accept", "application/json")
        if data is not None:
            request.add_header("content-type", "application/json")
        try:
            with urlopen(request, timeout=self.timeout, context=self._tls_context()) as response:
                text = response.read()
            return json.loads(text) if text else None
        except HTTPError as exc:
            exc.close()  # its answer's connection
            message = f"{label}: HTTP {exc.code} {exc.reason}"
            raise ManagementUnavailable(message, status=exc.code) from None
        except (OSError, http.client.HTTPException) as exc:  # a timeout, a reset, TLS
            why = tls_failure(exc)
            if why is not None:
                raise ManagementUnavailable(f"{label}: {why}", tls_refused=why) from None
            if isinstance(exc, URLError):
                raise ManagementUnavailable(f"{label}: unreachable ({exc.reason})") from None
            raise ManagementUnavailable(f"{label}: {type(exc).__name__}: {exc}") from None
        except ValueError:
            raise ManagementUnavailable(f"{label}: the answer is not JSON") from None

    def _tls_context(self) -> ssl.SSLContext | None:
        if not self.base.startswith("https:"):
            return None
        if self._context is None:
            self._context = self._tls.context()
        return self._context

    async def create_vhost(self, vhost: str, user: str | None = None) -> None:
        """Create ``vhost`` and let ``user`` (default: this client's) do anything in it."""
        await self.request("PUT", f"/vhosts/{_name(vhost)}", {})
        await self.set_permissions(vhost, user or self.user, EVERYTHING)

    async def delete_vhost(self, vhost: str) -> None:
        """Delete ``vhost`` and everything in it."""
        await self.request("DELETE", f"/vhosts/{_name(vhost)}")

    async def set_permissions(self, vhost: str, user: str, permissions: Mapping[str, str]) -> None:
        """Give ``user`` these configure/write/read patterns in ``vhost``."""
        await self.request("PUT", f"/permissions/{_name(vhost)}/{_name(user)}", dict(permissions))

    async def queues(self, vhost: str, **query: str) -> list[dict[str, Any]]:
        """Every queue of ``vhost`` (``columns=...`` to ask for less)."""
        found: list[dict[str, Any]] = await self.request("GET", f"/queues/{_name(vhost)}", **query)
        return found

    async def queue_names(self, vhost: str) -> list[str]:
        """The names of the queues of ``vhost``, sorted."""
        return sorted(str(queue["name"]) for queue in await self.queues(vhost, columns="name"))

    async def queue(self, vhost: str, name: str) -> dict[str, Any]:
        """One queue of ``vhost``, as the API shows it."""
        found: dict[str, Any] = await self.request("GET", f"/queues/{_name(vhost)}/{_name(name)}")
        return found

    async def set_policy(self, vhost: str, name: str, body: Mapping[str, Any]) -> None:
        """Create or replace policy ``name`` of ``vhost``."""
        await self.request("PUT", f"/policies/{_name(vhost)}/{_name(name)}", dict(body))

    async def delete_policy(self, vhost: str, name: str) -> None:
        """Remove policy ``name`` of ``vhost``."""
        await self.request("DELETE", f"/policies/{_name(vhost)}/{_name(name)}")

    async def close_connections(self, vhost: str, *, named: str = "") -> int:
        """Close every connection to ``vhost`` that its client named ``named...``; how many."""
        path = f"/vhosts/{_name(vhost)}/connections"
        found = await self.request("GET", path, columns="name,client_properties")
        names = [
            str(each["name"])
            for each in found
            if str((each.get("client_properties") or {}).get("connection_name", "")).startswith(
                named
            )
        ]
        for name in names:
            try:
                await self.request("DELETE", f"/connections/{_name(name)}")
            except ManagementUnavailable as exc:
                if exc.status != 404:  # not gone meanwhile
                    raise
        return len(names)


def url_beside(amqp_url: str) -> str:
    """The management API beside an AMQP node: http, its host, port 15672, its credentials."""
    parts = urlsplit(amqp_url)
    user, password = parts.username or "guest", parts.password or "guest"
    return f"http://{user}:{password}@{_host(parts.hostname)}:{MANAGEMENT_PORT}"


@dataclass(frozen=True)
class Endpoint:
    """Where the API is (no credentials in ``base``), whom to log in as, which vhost."""

    base: str
    user: str
    password: str
    vhost: str
    tls: TlsFiles = TlsFiles()

    def client(self, timeout: float = READ_TIMEOUT_SECONDS) -> Management:
        """A client of this endpoint."""
        return Management(
            self.base, user=self.user, password=self.password, timeout=timeout, tls=self.tls
        )


def endpoint_for(settings: Settings) -> Endpoint:
    """``EXPIRY_MANAGEMENT_URL``, or beside the first node of ``AMQP_URL`` (http on port
    15672; https on 15671 when that node is amqps://); its own credentials if it has some,
    else the AMQP URL's; the AMQP URL's vhost. An https API is checked with
    ``EXPIRY_MANAGEMENT_CA_FILE`` (and its client certificate), else the AMQP URL's files."""
    amqp = urlsplit(settings.amqp_url[0])
    user = unquote(amqp.username) if amqp.username is not None else "guest"
    password = unquote(amqp.password) if amqp.password is not None else "guest"
    vhost = unquote(amqp.path[1:]) if len(amqp.path) > 1 else "/"
    given_files = amqp_tls_files(amqp.query)
    tls = TlsFiles(
        settings.management_ca_file or given_files.get("cafile"),
        settings.management_cert_file or given_files.get("certfile"),
        settings.management_key_file
        or (given_files.get("keyfile") if settings.management_cert_file is None else None),
    )
    if settings.management_url is None:
        if amqp.scheme == "amqps":
            base = f"https://{_host(amqp.hostname)}:{MANAGEMENT_TLS_PORT}"
        else:
            base = f"http://{_host(amqp.hostname)}:{MANAGEMENT_PORT}"
        return Endpoint(base, user, password, vhost, tls)
    given = urlsplit(settings.management_url)
    if given.username is not None:
        user, password = unquote(given.username), unquote(given.password or "")
    return Endpoint(Management(settings.management_url).base, user, password, vhost, tls)


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
    expected = {"type": spec.type, "durable": True, "auto_delete": False, "internal": False}
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
    client = endpoint.client(timeout)
    answers = [
        await client.request(
            "GET",
            f"/{collection}/{_name(endpoint.vhost)}",
            label=f"GET /api/{collection}/{{vhost}}",
            columns=columns,
        )
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
