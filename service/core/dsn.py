"""PostgreSQL URLs as asyncpg reads them: validation, and the hosts they name.

Pure: no I/O. It follows libpq's URI grammar as asyncpg's ``connect_utils``
implements it: several comma-separated hosts, each with an optional port
(``h1:5432,h2:5433``, ``[::1]:5432``); hosts and ports in the query
(``?host=/var/run/postgresql&port=5432``, comma lists too); a percent-encoded
socket directory as host; no host at all (asyncpg then tries the usual socket
directories and localhost, or ``PGHOST``/``PGPORT``, which the caller passes
in); ``target_session_attrs`` and ``sslmode``.

Stricter than asyncpg where asyncpg would go on with a misread URL: every port
is a number from 1 to 65535 (also those asyncpg would ignore), and a raw ``@``
or ``#`` outside the ``user:password@`` part is refused (it is a password
that was not percent-encoded; asyncpg would connect to part of it as a host).
An error message never quotes the URL or any part of it: it may hold a password.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import ParseResult, parse_qs, quote, unquote, urlparse

SCHEMES = ("postgresql", "postgres")
DEFAULT_PORT = 5432
# Where asyncpg looks when neither the URL nor PGHOST names a host.
DEFAULT_HOSTS = ("/run/postgresql", "/var/run/postgresql", "/tmp", "/private/tmp", "localhost")
TARGET_SESSION_ATTRS = (
    "any",
    "primary",
    "standby",
    "prefer-standby",
    "read-write",
    "read-only",
)
SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
ENCODING_HINT = "a password containing @ / % # ? must be percent-encoded"

_IPV6 = re.compile(r"\[([^\]]+)\](?::([^:]*))?")


class DsnError(ValueError):
    """The URL is not one asyncpg can use; the message never quotes the URL."""


def _invalid(what: str) -> DsnError:
    return DsnError(f"not a valid URL: {what} ({ENCODING_HINT})")


@dataclass(frozen=True)
class Host:
    """One place to connect to: a host name or address and a port, or a socket directory."""

    address: str
    port: int

    @property
    def socket_path(self) -> str | None:
        """The unix socket's path when ``address`` is a directory, else ``None``."""
        if not self.address.startswith("/"):
            return None
        if ".s.PGSQL." in self.address:
            return self.address
        return posixpath.join(self.address, f".s.PGSQL.{self.port}")

    def __str__(self) -> str:
        if (path := self.socket_path) is not None:
            return path
        if ":" in self.address:
            return f"[{self.address}]:{self.port}"
        return f"{self.address}:{self.port}"


@dataclass(frozen=True)
class Dsn:
    """What a PostgreSQL URL says (the parts the service looks at)."""

    hosts: tuple[Host, ...]
    hosts_given: bool  # False: none named, asyncpg's defaults (or PGHOST) apply
    user: str | None
    password: str | None
    database: str | None
    target_session_attrs: str | None


def parse_dsn(dsn: str, environ: Mapping[str, str] | None = None) -> Dsn:
    """Validate ``dsn`` as asyncpg reads it and return its hosts; raise ``DsnError``.

    ``environ`` supplies ``PGHOST`` and ``PGPORT`` (asyncpg reads them from the
    process environment); none by default.
    """
    env = environ or {}
    parts = _split(dsn)
    query = _query(parts.query)
    auth, at, hostspec = parts.netloc.partition("@")  # asyncpg splits at the first @
    if not at:
        auth, hostspec = "", parts.netloc
    elif "@" in hostspec:
        raise _invalid("a raw @ in the host part")
    hosts = _hosts(hostspec, query, env)
    _check_options(query)
    user, _, password = auth.partition(":")
    database = unquote(parts.path.removeprefix("/")) if parts.path else None
    return Dsn(
        hosts=hosts,
        hosts_given=bool(hostspec or query.get("host") or env.get("PGHOST")),
        user=unquote(user) if user else query.get("user"),
        password=unquote(password) if password else query.get("password"),
        database=database or query.get("dbname") or query.get("database"),
        target_session_attrs=query.get("target_session_attrs"),
    )


def with_database(dsn: str, name: str) -> str:
    """``dsn`` naming database ``name`` (hosts, credentials and query kept)."""
    parts = urlparse(dsn)
    tail = (f";{parts.params}" if parts.params else "") + (f"?{parts.query}" if parts.query else "")
    return f"{parts.scheme}://{parts.netloc}/{quote(name, safe='')}{tail}"


def _split(dsn: str) -> ParseResult:
    return split_url(dsn, SCHEMES)


def split_url(url: str, schemes: tuple[str, ...]) -> ParseResult:
    """``url``'s parts, or ``DsnError`` (never quoting it: it may hold a password) for what
    a client library would misread: another scheme, a raw ``#``, a raw ``@`` after the
    host part."""
    try:
        parts = urlparse(url)
    except ValueError:
        raise _invalid("it cannot be parsed") from None
    if parts.scheme not in schemes:
        raise DsnError(f"must start with {' or '.join(s + '://' for s in schemes)}")
    if "#" in url:
        raise _invalid("a raw #")
    if "@" in parts.path or "@" in parts.params or "@" in parts.query:
        raise _invalid("a raw @ after the host part")
    return parts


def _query(text: str) -> dict[str, str]:
    if not text:
        return {}
    try:
        fields = parse_qs(text, strict_parsing=True)
    except ValueError:
        raise _invalid("the query is not name=value pairs joined by &") from None
    return {name: values[-1] for name, values in fields.items()}  # asyncpg: the last wins


def _hosts(hostspec: str, query: Mapping[str, str], env: Mapping[str, str]) -> tuple[Host, ...]:
    """The hosts, in asyncpg's order of precedence: URL, query, PGHOST, defaults."""
    ports = _port_list(query["port"]) if query.get("port") else None
    if hostspec:
        return _host_list(hostspec, None, env, quoted=True)
    if query.get("host"):
        return _host_list(query["host"], ports, env, quoted=False)
    if env.get("PGHOST"):
        return _host_list(env["PGHOST"], ports, env, quoted=False)
    matched = _match_ports(DEFAULT_HOSTS, ports or _env_ports(env))
    return tuple(Host(address, port) for address, port in zip(DEFAULT_HOSTS, matched, strict=True))


def _host_list(
    spec: str, ports: list[int] | None, env: Mapping[str, str], *, quoted: bool
) -> tuple[Host, ...]:
    items = spec.split(",")
    defaults = _match_ports(items, ports or _env_ports(env))
    hosts = []
    for item, default in zip(items, defaults, strict=True):
        address, port_text = _split_host(item)
        if quoted:
            address, port_text = unquote(address), unquote(port_text)
        if not address:
            raise _invalid("an empty host in the host list")
        own_port = _port(port_text) if port_text else None
        hosts.append(Host(address, default if ports or own_port is None else own_port))
    return tuple(hosts)


def _split_host(item: str) -> tuple[str, str]:
    """``(address, port text)`` of one host list item, as asyncpg splits it."""
    if item.startswith("/"):
        return item, ""
    if item.startswith("["):
        match = _IPV6.fullmatch(item)
        if match is None:
            raise _invalid("an IPv6 host must be [address] or [address]:port")
        return match[1], match[2] or ""
    address, _, port = item.partition(":")
    return address, port


def _port(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 65535:
        raise _invalid("a port must be a number from 1 to 65535")
    return int(text)


def _port_list(text: str) -> list[int]:
    return [_port(part) for part in text.split(",")]


def _env_ports(env: Mapping[str, str]) -> list[int]:
    text = env.get("PGPORT")
    if not text:
        return [DEFAULT_PORT]
    try:
        return _port_list(text)
    except DsnError:
        raise DsnError("PGPORT: a port must be a number from 1 to 65535") from None


def _match_ports(hosts: tuple[str, ...] | list[str], ports: list[int]) -> list[int]:
    """One port per host: a single port applies to every host, else the counts must match."""
    if len(ports) == 1:
        return ports * len(hosts)
    if len(ports) != len(hosts):
        raise DsnError(f"not a valid URL: {len(ports)} ports for {len(hosts)} hosts")
    return ports


def _check_options(query: Mapping[str, str]) -> None:
    attrs = query.get("target_session_attrs")
    if attrs is not None and attrs not in TARGET_SESSION_ATTRS:
        raise DsnError(f"target_session_attrs must be one of {', '.join(TARGET_SESSION_ATTRS)}")
    sslmode = query.get("sslmode")
    if sslmode is not None and sslmode.replace("_", "-") not in SSL_MODES:
        raise DsnError(f"sslmode must be one of {', '.join(SSL_MODES)}")
