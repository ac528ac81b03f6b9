"""POSTing one event to one endpoint: signed (Standard Webhooks, with the
``standardwebhooks`` library, by every secret of the endpoint), on the endpoint's
kept-alive connections (``connections.py``) opened over the SSRF guard
(``guarded_network.py``), redirects never followed, no proxy from the environment, TLS
verified, the response's body never read beyond a small bound and never kept.

The guard runs when a connection opens: the name is resolved, and the connection made
only to an address allowed, never to another (a name that resolves elsewhere later
cannot slip through, and nothing is opened to a refused address): only the URL's own
host, on the allow-list (``EXPIRY_WEBHOOK_ALLOWED_HOSTS``) when there is one, and only
a public address or one in the endpoint's ``allow_networks``; ``http://`` only to the
latter.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Final
from urllib.parse import quote, unquote, urlsplit

import certifi
import h11
from standardwebhooks.webhooks import Webhook

from service.adapters.http.connections import Connections, Headers
from service.adapters.http.guarded_network import NotAllowed
from service.core import webhook_policy
from service.core.webhook_policy import Answer
from service.settings import Endpoint
from service.settings.endpoints import host_allowed

USER_AGENT: Final = "expiry-service webhooks"
# What a request's path and query keep as they are (anything else not in ASCII is
# percent-encoded, as an HTTP client sends it).
URL_SAFE: Final = "/?&=%:@!$'()*+,;~"
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def public(address: IPAddress) -> bool:
    """A globally reachable unicast address (and no private one hidden in NAT64 or a
    mapped IPv4 address)."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return public(address.ipv4_mapped)
        if address in _NAT64:
            return public(ipaddress.IPv4Address(address.packed[-4:]))
    # is_global holds for some multicast ranges (224.0.0.1 is "global" to ipaddress).
    return address.is_global and not address.is_multicast


def allowed(
    endpoint: Endpoint, hostname: str, address: IPAddress, hosts: tuple[str, ...] = ()
) -> bool:
    """Whether a connection for ``endpoint`` may open to ``address`` (for ``hostname``;
    ``hosts``: EXPIRY_WEBHOOK_ALLOWED_HOSTS)."""
    if hostname.lower().rstrip(".") != endpoint.host.rstrip("."):
        return False  # only the URL's host
    if not host_allowed(hostname, hosts):
        return False
    if any(address in network for network in endpoint.allow_networks):
        return True
    return not endpoint.plain_http and public(address)


def trust() -> ssl.SSLContext:
    """The certificates a receiver's must chain to: the system's (OpenSSL's default paths,
    which SSL_CERT_FILE and SSL_CERT_DIR move: a private CA goes there), else certifi's
    when the system has none. Verified, always: host name and chain."""
    context = ssl.create_default_context()
    if not context.cert_store_stats()["x509_ca"]:
        context.load_verify_locations(cafile=certifi.where())
    return context


class Sender:
    """One endpoint's client: connections kept alive up to ``concurrency`` at once."""

    def __init__(
        self, endpoint: Endpoint, *, concurrency: int, hosts: tuple[str, ...] = ()
    ) -> None:
        self.endpoint = endpoint
        # Every secret signs (a rotation: the receiver accepts either, Standard Webhooks).
        self._signers = [Webhook(secret.get_secret_value()) for secret in endpoint.secret]
        target = _target(endpoint.url)
        self._path, self._fixed = target.path, _encoded(target.headers)
        self._connections = Connections(
            target.host,
            target.port,
            trust() if target.tls else None,
            lambda host, address: allowed(endpoint, host, address, hosts),
            concurrency,
        )

    async def close(self) -> None:
        """Close the connections."""
        await self._connections.close()

    def headers(self, message_id: str, body: bytes, now: datetime) -> dict[str, str]:
        """The Standard Webhooks headers of one attempt."""
        return {
            "content-type": "application/json",
            "webhook-id": message_id,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": " ".join(
                signer.sign(message_id, now, body) for signer in self._signers
            ),
        }

    async def post(
        self,
        message_id: str,
        body: bytes,
        now: datetime,
        carried: Mapping[str, str] | None = None,
    ) -> Answer:
        """One attempt (``carried``: its trace headers): the answer, from the status and
        ``Retry-After`` only."""
        timeout = self.endpoint.timeout_seconds
        headers = [
            *self._fixed,
            (b"content-length", b"%d" % len(body)),
            *_encoded(self.headers(message_id, body, now)),
            *_encoded(carried or {}),
        ]
        try:
            # The whole attempt, not each read: a trickling answer times out too.
            async with asyncio.timeout(timeout):
                answered = await self._connections.request(
                    h11.Request(method=b"POST", target=self._path, headers=headers), body
                )
        except NotAllowed:
            return webhook_policy.not_allowed("not the endpoint's host, or an address not allowed")
        except TimeoutError:
            return webhook_policy.timed_out(timeout)
        except Exception as exc:  # the network's, or whatever else fails an attempt: it
            return webhook_policy.unreachable(type(exc).__name__)  # counts against its budget
        retry_after = _header(answered.headers, b"retry-after")
        return webhook_policy.of_status(
            answered.status, webhook_policy.retry_after_seconds(retry_after, now)
        )


@dataclass(frozen=True)
class Target:
    """Where an endpoint's URL sends: its host and port, whether over TLS, the request's
    path (and query), and the headers it implies."""

    host: str
    port: int
    tls: bool
    path: bytes
    headers: dict[str, str]


def _target(url: str) -> Target:
    """Where ``url`` sends, and the headers it implies: its Host (an IPv6 address in
    brackets), Basic authentication from its credentials (never sent elsewhere)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else _ascii_host(host)
    if parts.port is not None:
        netloc += f":{parts.port}"
    headers = {"host": netloc, "user-agent": USER_AGENT}
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        headers["authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
    tls = parts.scheme == "https"
    path = quote((parts.path or "/") + (f"?{parts.query}" if parts.query else ""), safe=URL_SAFE)
    port = parts.port or (443 if tls else 80)
    return Target(host, port, tls, path.encode("ascii"), headers)


def _ascii_host(host: str) -> str:
    """A host name as the Host header spells it (IDNA for a name not in ASCII)."""
    try:
        return host.encode("idna").decode("ascii")
    except UnicodeError:
        return host  # (no such name resolves either: each attempt fails, unreachable)


def _encoded(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    return [(name.encode("ascii"), value.encode()) for name, value in headers.items()]


def _header(headers: Headers, name: bytes) -> str | None:
    """A response header's value (the first; the names as h11 gives them, lower case),
    or None."""
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None
