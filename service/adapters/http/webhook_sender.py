"""POSTing one event to one endpoint: signed (Standard Webhooks, with the
``standardwebhooks`` library, by every secret of the endpoint), through ``httpcore``'s
connection pool over the SSRF guard (``guarded_network.py``), redirects never followed
(``httpcore`` follows none), no proxy from the environment, TLS verified, the response's
body never read beyond a small bound and never kept.

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
from datetime import datetime
from typing import Final
from urllib.parse import unquote, urlsplit

import certifi
import httpcore
from standardwebhooks.webhooks import Webhook

from service.adapters.http.guarded_network import GuardedBackend, NotAllowed
from service.core import webhook_policy
from service.core.webhook_policy import Answer
from service.settings import Endpoint
from service.settings.endpoints import host_allowed

# What is read of a response's body, at most, before the connection is dropped: enough
# for a small answer to leave the connection reusable; the bytes are thrown away.
BODY_READ_LIMIT: Final = 64 * 1024
USER_AGENT: Final = "expiry-service webhooks"
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
        self._url, self._fixed = _target(endpoint.url)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=trust(),
            max_connections=concurrency,
            max_keepalive_connections=concurrency,
            network_backend=GuardedBackend(
                lambda host, address: allowed(endpoint, host, address, hosts)
            ),
        )

    async def close(self) -> None:
        """Close the connections."""
        await self._pool.aclose()

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
            *self._fixed.items(),
            *self.headers(message_id, body, now).items(),
            *(carried or {}).items(),
        ]
        try:
            # The whole attempt, not each read: a trickling answer times out too.
            async with (
                asyncio.timeout(timeout),
                self._pool.stream("POST", self._url, headers=headers, content=body) as response,
            ):
                await _drain(response)
                retry_after = webhook_policy.retry_after_seconds(
                    _header(response, b"retry-after"), now
                )
                return webhook_policy.of_status(response.status, retry_after)
        except NotAllowed:
            return webhook_policy.not_allowed("not the endpoint's host, or an address not allowed")
        except (httpcore.TimeoutException, TimeoutError):
            return webhook_policy.timed_out(timeout)
        except Exception as exc:  # the network's, or whatever else fails an attempt: it
            return webhook_policy.unreachable(type(exc).__name__)  # counts against its budget


def _target(url: str) -> tuple[str, dict[str, str]]:
    """The URL to send to (without its credentials) and the headers it implies: its Host
    (an IPv6 address in brackets), and Basic authentication from its credentials."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    headers = {"host": netloc, "user-agent": USER_AGENT}
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        headers["authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
    return parts._replace(netloc=netloc).geturl(), headers


def _header(response: httpcore.Response, name: bytes) -> str | None:
    """A response header's value (the first), or None."""
    for key, value in response.headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


async def _drain(response: httpcore.Response) -> None:
    """Read (and drop) a small body so that the connection can serve again; past the
    bound, stop: closing the response then closes its connection."""
    read = 0
    async for chunk in response.aiter_stream():
        read += len(chunk)
        if read > BODY_READ_LIMIT:
            return
