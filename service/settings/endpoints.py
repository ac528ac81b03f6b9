"""What ``EXPIRY_WEBHOOKS`` (or the file ``EXPIRY_WEBHOOKS_FILE`` names) accepts: the
endpoints ``python -m service.deliver`` POSTs events to (../shared/CONTRACT.md,
"Webhooks"), and the knobs of that delivery.

A refusal names the endpoint (by its place in the list and its name) and the field,
never a URL or a secret.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import re
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode

from service.core.redaction import register_url_secrets

SECRET_PREFIX = "whsec_"
# The Standard Webhooks specification: secrets of 24 to 64 random bytes.
SECRET_BYTES = (24, 64)
# Secrets at once (each signs): the old and the new during a rotation, and some room.
MAX_SECRETS = 5
NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
HOST_PATTERN = re.compile(r"^(\*\.)?[a-z0-9]([a-z0-9-]{0,62}\.)*[a-z0-9-]{1,63}$|^[0-9a-f:.]+$")
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class Endpoint(BaseModel):
    """One receiver: where events go, the secrets they are signed with (one, or a list
    during a rotation: each signs), and its limits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    url: str
    secret: tuple[SecretStr, ...]
    # Requests per second to this endpoint, across every deliverer together.
    rate_per_second: float = Field(default=20.0, gt=0, le=10_000)
    # The Standard Webhooks specification asks receivers to answer within 15 s to 30 s.
    timeout_seconds: float = Field(default=15.0, gt=0, le=300)
    # Networks the resolved address may be in besides public addresses (CIDRs).
    allow_networks: tuple[Network, ...] = ()

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not NAME.fullmatch(value):
            raise ValueError(
                "must be 1 to 63 lower-case letters, digits, '.', '_' or '-', "
                "starting with a letter or digit"
            )
        return value

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        try:
            parts = urlsplit(value)
            port = parts.port
        except ValueError:
            raise ValueError("is not a URL") from None
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise ValueError("must be an https:// URL with a host")
        if port == 0:
            raise ValueError("has port 0")
        if parts.fragment:
            raise ValueError("may not have a #fragment")
        register_url_secrets(value)  # credentials in it are never logged
        return value

    @field_validator("secret", mode="before")
    @classmethod
    def _check_secret(cls, value: Any) -> tuple[SecretStr, ...]:
        items = [value] if isinstance(value, str | SecretStr) else value
        if not isinstance(items, list | tuple) or not 1 <= len(items) <= MAX_SECRETS:
            raise ValueError(f"must be a secret, or a list of 1 to {MAX_SECRETS} secrets")
        secrets = tuple(
            _secret(item.get_secret_value() if isinstance(item, SecretStr) else item)
            for item in items
        )
        if len({secret.get_secret_value() for secret in secrets}) < len(secrets):
            raise ValueError("lists the same secret twice")
        return secrets

    @field_validator("allow_networks", mode="before")
    @classmethod
    def _check_networks(cls, value: Any) -> tuple[Network, ...]:
        if not isinstance(value, list | tuple):
            raise ValueError('must be a list of CIDRs, e.g. ["127.0.0.0/8"]')  # noqa: TRY004 (pydantic's)
        networks = []
        for item in value:
            try:
                networks.append(ipaddress.ip_network(str(item), strict=False))
            except ValueError:
                raise ValueError(f"{str(item)[:45]!r} is not a CIDR") from None
        return tuple(networks)

    @model_validator(mode="after")
    def _check_plain_http(self) -> Endpoint:
        if urlsplit(self.url).scheme == "http" and not self.allow_networks:
            raise ValueError(
                "url: http:// only to an address in allow_networks (none given); use https://"
            )
        return self

    @property
    def host(self) -> str:
        """The URL's host name (the allow-list's only entry for this endpoint)."""
        return (urlsplit(self.url).hostname or "").lower()

    @property
    def plain_http(self) -> bool:
        """The URL is http:// (allowed only to an address in ``allow_networks``)."""
        return urlsplit(self.url).scheme == "http"


def _secret(value: Any) -> SecretStr:
    """One secret as the Standard Webhooks specification spells it, or a ``ValueError``
    that never quotes it."""
    low, high = SECRET_BYTES
    problem = f"must be {SECRET_PREFIX} followed by the base64 of {low} to {high} random bytes"
    if not isinstance(value, str) or not value.startswith(SECRET_PREFIX):
        raise ValueError(problem)
    try:
        key = base64.b64decode(value.removeprefix(SECRET_PREFIX), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(problem) from None
    if not low <= len(key) <= high:
        raise ValueError(problem)
    return SecretStr(value)


def parse_endpoints(text: str) -> tuple[Endpoint, ...]:
    """The endpoints of a JSON array, or a ``ValueError`` that names what is wrong (never
    a value: the text holds secrets)."""
    try:
        items = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not JSON (line {getattr(exc, 'lineno', '?')})") from None
    if not isinstance(items, list):
        raise ValueError("must be a JSON array of endpoints")  # noqa: TRY004 (pydantic's)
    endpoints = []
    for place, item in enumerate(items, start=1):
        label = f"endpoint {place}"
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            label += f" ({item['name'][:63]!r})"
        try:
            endpoints.append(Endpoint.model_validate(item))
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(part) for part in error["loc"])
            message = str(error["msg"]).removeprefix("Value error, ")
            raise ValueError(f"{label}: {where + ': ' if where else ''}{message}") from None
    names = [endpoint.name for endpoint in endpoints]
    if duplicate := next((n for n in names if names.count(n) > 1), None):
        raise ValueError(f"two endpoints are named {duplicate!r}")
    return tuple(endpoints)


class _Webhooks(BaseSettings):
    """HTTP delivery of events (``python -m service.deliver``; docs/webhooks.md)."""

    # The endpoints: a JSON array (the contract's), or the path of a file that holds it
    # (a mounted Kubernetes Secret): one of the two, never both.
    webhooks: Annotated[tuple[Endpoint, ...], NoDecode] = Field(
        default=(), validation_alias=AliasChoices("EXPIRY_WEBHOOKS")
    )
    webhooks_file: Path | None = None
    # The hosts deliveries may go to (names, or *.domain for its subdomains), comma-
    # separated: every endpoint's host must be one (checked at start and at every
    # connection). Empty: each endpoint's own host, and nothing else.
    webhook_allowed_hosts: Annotated[tuple[str, ...], NoDecode] = ()
    # Attempts and age (since the event was written) before a delivery that keeps
    # failing with a retryable failure becomes a dead letter.
    webhook_max_attempts: int = Field(default=15, ge=1, le=1000)
    webhook_max_age_seconds: float = Field(default=86_400.0, ge=1, le=30 * 86_400)
    # Exponential backoff from the first delay to the cap, with jitter; a Retry-After
    # is honoured up to its own cap.
    webhook_backoff_seconds: float = Field(default=1.0, gt=0, le=3600)
    webhook_backoff_cap_seconds: float = Field(default=600.0, gt=0, le=86_400)
    webhook_retry_after_cap_seconds: float = Field(default=300.0, ge=1, le=86_400)
    # Requests in flight to one endpoint from one deliverer.
    webhook_concurrency: int = Field(default=8, ge=1, le=256)
    # A claim's lease: longer than any endpoint's timeout (checked at start).
    webhook_lease_seconds: float = Field(default=60.0, ge=1, le=3600)
    webhook_poll_seconds: float = Field(default=1.0, gt=0, le=300)
    # After this many failed attempts in a row an endpoint pauses (every deliverer), at
    # first for webhook_pause_seconds, then twice as long each time up to the cap; a
    # single probe ends a pause.
    webhook_pause_after: int = Field(default=5, ge=1, le=1000)
    webhook_pause_seconds: float = Field(default=15.0, gt=0, le=3600)
    webhook_pause_cap_seconds: float = Field(default=600.0, gt=0, le=86_400)
    # The age of an endpoint's oldest pending delivery above which status says so (and
    # the alert ExpiryWebhooksBehind).
    webhook_objective_seconds: float = Field(default=300.0, gt=0, le=30 * 86_400)

    @field_validator("webhooks", mode="before")
    @classmethod
    def _parse_webhooks(cls, value: Any) -> Any:
        if isinstance(value, str):
            return parse_endpoints(value) if value.strip() else ()
        return value

    @field_validator("webhook_allowed_hosts", mode="before")
    @classmethod
    def _parse_hosts(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [part.strip().lower() for part in value.split(",") if part.strip()]
        for host in value:
            if not HOST_PATTERN.fullmatch(str(host)):
                raise ValueError(
                    f"{str(host)[:63]!r} is neither a host name nor *.domain (comma-separated)"
                )
        return tuple(value)

    @model_validator(mode="after")
    def _endpoints(self) -> _Webhooks:
        self._read_webhooks_file()
        for endpoint in self.webhooks:
            if not host_allowed(endpoint.host, self.webhook_allowed_hosts):
                raise ValueError(
                    f"EXPIRY_WEBHOOK_ALLOWED_HOSTS: endpoint {endpoint.name!r} goes to "
                    f"{endpoint.host!r}, which is not on the list"
                )
        return self

    def _read_webhooks_file(self) -> None:
        if self.webhooks_file is None:
            return
        if self.webhooks:
            raise ValueError("EXPIRY_WEBHOOKS and EXPIRY_WEBHOOKS_FILE are both set: set one")
        try:
            text = self.webhooks_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            what = type(exc).__name__
            raise ValueError(f"EXPIRY_WEBHOOKS_FILE: cannot read it ({what})") from None
        try:
            endpoints = parse_endpoints(text)
        except ValueError as exc:
            raise ValueError(f"EXPIRY_WEBHOOKS_FILE: {exc}") from None
        object.__setattr__(self, "webhooks", endpoints)


def host_allowed(host: str, allowed: tuple[str, ...]) -> bool:
    """Whether ``host`` is on the list (``*.domain``: its subdomains); an empty list
    allows any (each endpoint's own host is then its only one)."""
    host = host.lower().rstrip(".")
    if not allowed:
        return True
    return any(
        host.endswith(pattern[1:]) if pattern.startswith("*.") else host == pattern
        for pattern in allowed
    )
