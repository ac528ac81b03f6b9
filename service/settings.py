"""Settings: the only reader of the environment.

``DATABASE_URL`` and ``AMQP_URL`` keep their contract names; everything else
has the ``EXPIRY_`` prefix and a documented default (see README).
"""

from __future__ import annotations

import os
import socket
from typing import Annotated, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import (
    AliasChoices,
    Field,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    field_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from service.errors import ConfigError

_DB_SCHEMES = ("postgresql", "postgres")
_AMQP_SCHEMES = ("amqp", "amqps")


def _default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Settings(BaseSettings):
    """Every knob of the service; see the README's settings table."""

    model_config = SettingsConfigDict(
        env_prefix="EXPIRY_",
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        frozen=True,
        validate_by_name=True,
    )

    database_url: str = Field(
        default="postgresql://postgres@localhost:5432/postgres",
        validation_alias=AliasChoices("DATABASE_URL"),
    )
    amqp_url: Annotated[tuple[str, ...], NoDecode] = Field(
        default=("amqp://guest:guest@localhost:5672/",),
        validation_alias=AliasChoices("AMQP_URL"),
    )

    prefetch: PositiveInt = 400
    batch_size: PositiveInt = 100
    batch_wait_ms: float = Field(default=5.0, ge=0, le=1000)
    retry_delays: Annotated[tuple[PositiveInt, ...], NoDecode] = (1, 5, 30, 120)
    max_attempts: PositiveInt = 10
    max_age_seconds: PositiveInt = 3600
    lease_seconds: PositiveInt = 300
    scan_batch_size: PositiveInt = 500
    publish_timeout_seconds: PositiveFloat = 10.0
    db_pool_size: PositiveInt = 10
    db_connect_timeout_seconds: PositiveFloat = 5.0
    lock_timeout_ms: PositiveInt = 2000
    statement_timeout_ms: PositiveInt = 10000
    heartbeat_seconds: PositiveInt = 10
    shutdown_timeout_seconds: PositiveFloat = 30.0
    worker_id: str = Field(default_factory=_default_worker_id, min_length=1, max_length=200)
    http_port: int = Field(default=0, ge=0, le=65535)
    http_host: str = "127.0.0.1"
    oldest_due_objective_seconds: PositiveFloat = 120.0
    scan_interval_seconds: PositiveFloat = 5.0
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["json", "text"] = "json"
    # The standard OpenTelemetry variables that choose exporters (the SDK reads the rest).
    otel_traces_exporter: Literal["otlp", "console", "none"] | None = Field(
        default=None, validation_alias=AliasChoices("OTEL_TRACES_EXPORTER")
    )
    otel_metrics_exporter: Literal["otlp", "console", "none", "prometheus"] | None = Field(
        default=None, validation_alias=AliasChoices("OTEL_METRICS_EXPORTER")
    )
    otel_endpoint: str | None = Field(
        default=None,
        validation_alias=AliasChoices(
            "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
        ),
    )
    otel_sdk_disabled: bool = Field(
        default=False, validation_alias=AliasChoices("OTEL_SDK_DISABLED")
    )
    # Test-only: makes a crash happen at a chosen point (see consume.py).
    failpoint: str = Field(default="", pattern=r"^(|exit-after-commit|exit-on:[0-9a-fA-F-]{36})$")

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, value: str) -> str:
        return _check_url(value, _DB_SCHEMES)

    @field_validator("amqp_url", mode="before")
    @classmethod
    def _split_amqp_urls(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("amqp_url")
    @classmethod
    def _check_amqp_urls(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("must name at least one amqp:// URL")
        return tuple(_check_url(url, _AMQP_SCHEMES) for url in value)

    @field_validator("retry_delays", mode="before")
    @classmethod
    def _split_delays(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("retry_delays")
    @classmethod
    def _check_delays(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value:
            raise ValueError("must list at least one delay in seconds")
        if list(value) != sorted(set(value)):
            raise ValueError("must be strictly increasing, e.g. 1,5,30,120")
        return value


def _check_url(value: str, schemes: tuple[str, ...]) -> str:
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018  (raises ValueError on a bad port)
    except ValueError as exc:
        raise ValueError(f"not a valid URL ({exc})") from None
    if parts.scheme not in schemes:
        raise ValueError(f"must start with {' or '.join(s + '://' for s in schemes)}")
    if not parts.hostname:
        raise ValueError("has no host")
    return value


def redact_url(url: str) -> str:
    """Return ``url`` with its password replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


_ENV_NAMES = {
    "database_url": "DATABASE_URL",
    "amqp_url": "AMQP_URL",
    "otel_traces_exporter": "OTEL_TRACES_EXPORTER",
    "otel_metrics_exporter": "OTEL_METRICS_EXPORTER",
    "otel_endpoint": "OTEL_EXPORTER_OTLP_ENDPOINT",
    "otel_sdk_disabled": "OTEL_SDK_DISABLED",
}


def load_settings() -> Settings:
    """Read settings from the environment (and ``.env``), or raise ``ConfigError``."""
    try:
        return Settings()
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else "settings"
        name = _ENV_NAMES.get(field.lower(), f"EXPIRY_{field.upper()}")
        message = str(error["msg"]).removeprefix("Value error, ")
        raise ConfigError(f"{name}: {message}") from None
