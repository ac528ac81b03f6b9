"""The network under the webhooks' HTTP connections: a name is resolved, every address it
resolves to is checked, and a connection is opened only to an address allowed, never to
another, not even to pick one (an SSRF guard that connects first would let an endpoint
probe the inside network's ports).

It is an ``httpcore`` network backend (httpcore's public interface for exactly this):
the connection pool asks it for a TCP stream to the URL's host, and TLS then runs over
that stream for the URL's host name, as it would have without it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Callable, Iterable

import httpcore

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# (host as in the URL, an address it resolved to) -> may a connection open to it
Admit = Callable[[str, IPAddress], bool]


class NotAllowed(httpcore.ConnectError):
    """The host resolved to no address a connection may open to: none was opened."""


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """Connects only to the resolved addresses ``admit`` allows, in the resolver's order,
    the next one when one does not answer."""

    def __init__(self, admit: Admit, backend: httpcore.AsyncNetworkBackend | None = None) -> None:
        self._admit = admit
        self._backend = backend or httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        async with asyncio.timeout_at(deadline):
            addresses = await resolve(host, port)
        allowed = [address for address in addresses if self._admit(host, address)]
        if not allowed:
            raise NotAllowed(f"no address of {host!r} may be connected to")
        failure: httpcore.ConnectError | None = None
        for address in allowed:
            left = None if deadline is None else max(0.0, deadline - loop.time())
            try:
                return await self._backend.connect_tcp(
                    str(address),
                    port,
                    timeout=left,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except httpcore.ConnectError as exc:
                failure = exc
        assert failure is not None
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise NotAllowed("no Unix socket may be connected to")

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


async def resolve(host: str, port: int) -> list[IPAddress]:
    """The addresses ``host`` resolves to (itself when it is one), in the resolver's
    order, each once; a name that resolves to none is a ``ConnectError``."""
    try:
        found = await asyncio.get_running_loop().getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
    except OSError as exc:
        raise httpcore.ConnectError(f"{host!r} does not resolve ({type(exc).__name__})") from None
    addresses: list[IPAddress] = []
    for _family, _type, _proto, _name, sockaddr in found:
        address = ipaddress.ip_address(str(sockaddr[0]).partition("%")[0])
        if address not in addresses:
            addresses.append(address)
    return addresses
