"""POSTing one event to one endpoint: signed (Standard Webhooks, with the
``standardwebhooks`` library), with the SSRF guard at every connection
(``httpx-secure``), redirects never followed, TLS verified, the response's body never
read beyond a small bound and never kept.

The guard runs when a connection opens, on the address it opens to (the name is
resolved once and the connection made to that very address: a name that resolves
elsewhere later cannot slip through): only the URL's own host, on the allow-list
(``EXPIRY_WEBHOOK_ALLOWED_HOSTS``) when there is one, and only a public address or one
in the endpoint's ``allow_networks``; ``http://`` only to the latter.
"""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
from datetime import datetime
from typing import Final

import certifi
import httpx
from httpx_secure import SSRFProtectionError, httpx_ssrf_protection
from standardwebhooks.webhooks import Webhook

from service.core import webhook_policy
from service.core.webhook_policy import Answer
from service.settings import Endpoint
from service.settings.endpoints import host_allowed

# What is read of a response's body, at most, before the connection is dropped: enough
# for a small answer to leave the connection reusable; the bytes are thrown away.
BODY_READ_LIMIT: Final = 64 * 1024
USER_AGENT: Final = "expiry-service webhooks"
DNS_CACHE_SECONDS: Final = 30.0
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
        self._signer = Webhook(endpoint.secret.get_secret_value())
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(endpoint.timeout_seconds),
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
            follow_redirects=False,
            trust_env=False,  # no proxy from the environment: the guard sees the real peer
            verify=trust(),
            headers={"user-agent": USER_AGENT},
        )
        httpx_ssrf_protection(
            self._client,
            check_globally_reachable=False,  # ours decides: allow_networks may widen it
            # A name's address (or its refusal) is kept this long: a DNS change shows soon.
            dns_cache_ttl=DNS_CACHE_SECONDS,
            custom_validator=lambda host, address, _port: allowed(endpoint, host, address, hosts),
        )

    async def close(self) -> None:
        """Close the connections."""
        await self._client.aclose()

    def headers(self, message_id: str, body: bytes, now: datetime) -> dict[str, str]:
        """The Standard Webhooks headers of one attempt."""
        return {
            "content-type": "application/json",
            "webhook-id": message_id,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": self._signer.sign(message_id, now, body),
        }

    async def post(self, message_id: str, body: bytes, now: datetime) -> Answer:
        """One attempt: the answer, from the status and ``Retry-After`` only."""
        timeout = self.endpoint.timeout_seconds
        try:
            # The whole attempt, not each read: a trickling answer times out too.
            async with (
                asyncio.timeout(timeout),
                self._client.stream(
                    "POST",
                    self.endpoint.url,
                    content=body,
                    headers=self.headers(message_id, body, now),
                ) as response,
            ):
                await _drain(response)
                retry_after = webhook_policy.retry_after_seconds(
                    response.headers.get("retry-after"), now
                )
                return webhook_policy.of_status(response.status_code, retry_after)
        except SSRFProtectionError:
            return webhook_policy.not_allowed("not the endpoint's host, or an address not allowed")
        except (httpx.TimeoutException, TimeoutError):
            return webhook_policy.timed_out(timeout)
        except httpx.TransportError as exc:
            return webhook_policy.unreachable(type(exc).__name__)
        except Exception as exc:  # whatever else fails an attempt counts against its budget
            return webhook_policy.unreachable(type(exc).__name__)


async def _drain(response: httpx.Response) -> None:
    """Read (and drop) a small body so that the connection can serve again; past the
    bound, stop: closing the response then closes its connection."""
    read = 0
    async for chunk in response.aiter_raw():
        read += len(chunk)
        if read > BODY_READ_LIMIT:
            return
