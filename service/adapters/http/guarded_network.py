"""The network under the webhooks' HTTP connections: a name is resolved, every address it
resolves to is checked, and a connection is opened only to an address allowed, never to
another, not even to pick one (an SSRF guard that connects first would let an endpoint
probe the inside network's ports).

``connect`` opens the connection that ``connections.py`` sends on: TCP to the allowed
address itself (so a name that resolves elsewhere later cannot slip through), and TLS
over it for the URL's host name (its certificate verified for that name).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import Callable

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# (host as in the URL, an address it resolved to) -> may a connection open to it
Admit = Callable[[str, IPAddress], bool]
Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class ConnectError(Exception):
    """No connection could be opened (the name, the network, TLS)."""


class NotAllowed(ConnectError):
    """The host resolved to no address a connection may open to: none was opened."""


async def connect(host: str, port: int, admit: Admit, tls: ssl.SSLContext | None) -> Streams:
    """A connection to ``host``, to the first address it resolves to that ``admit``
    allows and that answers, in the resolver's order (TLS over it with ``tls``)."""
    addresses = await resolve(host, port)
    allowed = [address for address in addresses if admit(host, address)]
    if not allowed:
        raise NotAllowed(f"no address of {host!r} may be connected to")
    failure: OSError | None = None
    for address in allowed:
        try:
            return await asyncio.open_connection(
                str(address), port, ssl=tls, server_hostname=host if tls else None
            )
        except OSError as exc:  # refused, unreachable, TLS (ssl.SSLError is one)
            failure = exc
    raise ConnectError(f"{host!r}: no allowed address answered") from failure


async def resolve(host: str, port: int) -> list[IPAddress]:
    """The addresses ``host`` resolves to (itself when it is one), in the resolver's
    order, each once; a name that resolves to none is a ``ConnectError``."""
    try:
        found = await asyncio.get_running_loop().getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
    except OSError as exc:
        raise ConnectError(f"{host!r} does not resolve ({type(exc).__name__})") from None
    addresses: list[IPAddress] = []
    for _family, _type, _proto, _name, sockaddr in found:
        address = ipaddress.ip_address(str(sockaddr[0]).partition("%")[0])
        if address not in addresses:
            addresses.append(address)
    return addresses
