"""What the ``EXPIRY_*`` settings and the contract's ``DATABASE_URL`` and ``AMQP_URL``
accept: one class per concern, composed into ``Settings`` (``loading.py``).

The standard ``OTEL_*`` variables are ``otel_variables.py``'s.
"""

from __future__ import annotations

import importlib.util
import os
import socket
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import (
    AliasChoices,
    Field,
    PositiveFloat,
    PositiveInt,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode

from service.core.default_owners import OwnerRule, parse_owner_rules
from service.core.dsn import ENCODING_HINT, parse_dsn, split_url
from service.core.redaction import register_url_secrets
from service.settings.tls_files import check_amqp_tls, check_management_tls, check_postgres_tls

_AMQP_SCHEMES = ("amqp", "amqps")
OPERATOR_LIMIT = 64
# Delay queues per backoff tier when retries are jittered.
MIN_JITTER_SLOTS, MAX_JITTER_SLOTS = 2, 32


def _default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class _Connections(BaseSettings):
    """Where the servers are: ``DATABASE_URL``, ``AMQP_URL``, the management API."""

    database_url: str = Field(
        default="postgresql://postgres@localhost:5432/postgres",
        validation_alias=AliasChoices("DATABASE_URL"),
    )
    amqp_url: Annotated[tuple[str, ...], NoDecode] = Field(
        default=("amqp://guest:guest@localhost:5672/",),
        validation_alias=AliasChoices("AMQP_URL"),
    )
    # The RabbitMQ management API, where the running processes read the queues'
    # arguments to check them (they may not declare) and the demo makes its vhost;
    # default: beside the first node of AMQP_URL, port 15672, with its credentials.
    # RABBITMQ_MANAGEMENT_URL (compose's demo, the tests) is read when it is not set.
    management_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("EXPIRY_MANAGEMENT_URL", "RABBITMQ_MANAGEMENT_URL"),
    )

    # How DATABASE_URL reaches PostgreSQL: "none" (straight, or a pooler in session mode)
    # or "transaction" (a transaction pooler: PgBouncer's pool_mode = transaction, RDS
    # Proxy, Supavisor's transaction port): no named prepared statements, no start-up
    # parameter but application_name, the timeouts set in each transaction
    # (adapters/postgres/pool.py).
    db_pooler: Literal["none", "transaction"] = "none"
    # Behind a transaction pooler, a URL that reaches PostgreSQL with a session of its own
    # (straight, or a session-mode port), for what lives on a session: the relay's LISTEN.
    # Unset, the relay polls (EXPIRY_RELAY_POLL_SECONDS) and says so at start.
    db_session_url: str | None = None
    # The management API's TLS, when its URL is https:// (docs/deployment.md, "TLS"):
    # the CA that signed its certificate (unset: the first AMQP_URL's cafile, else the
    # system's CAs), and a client certificate with its key where it asks for one (unset:
    # the AMQP URL's certfile and keyfile).
    management_ca_file: str | None = None
    management_cert_file: str | None = None
    management_key_file: str | None = None

    @field_validator("database_url", "db_session_url", mode="before")
    @classmethod
    def _remember_database_password(cls, value: object) -> object:
        if isinstance(value, str):
            register_url_secrets(value)
        return value

    @field_validator("database_url", "db_session_url")
    @classmethod
    def _check_database_url(cls, value: str | None) -> str | None:
        if value is not None:
            parse_dsn(value)  # raises DsnError, a ValueError that never quotes the URL
            check_postgres_tls(urlsplit(value).query)
        return value

    @field_validator("amqp_url", mode="before")
    @classmethod
    def _split_amqp_urls(cls, value: object) -> object:
        if isinstance(value, str):
            register_url_secrets(value)
            return tuple(part.strip() for part in value.split(",") if part.strip())
        if isinstance(value, tuple | list):
            register_url_secrets(",".join(str(url) for url in value))
        return value

    @field_validator("amqp_url")
    @classmethod
    def _check_amqp_urls(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("must name at least one amqp:// URL")
        return tuple(_check_amqp_url(url) for url in value)

    @field_validator("management_url", mode="before")
    @classmethod
    def _check_management_url(cls, value: object) -> object:
        if isinstance(value, str):
            register_url_secrets(value)
            if urlsplit(value.strip()).scheme not in ("http", "https") or not value.strip():
                raise ValueError("must be an http:// or https:// URL")
            return value.strip()
        return value

    @model_validator(mode="after")
    def _check_management_tls(self) -> _Connections:
        check_management_tls(
            self.management_ca_file, self.management_cert_file, self.management_key_file
        )
        return self


class _Pipeline(BaseSettings):
    """How the scan and the consumers work: batches, retries, leases, timeouts, logs."""

    prefetch: PositiveInt = 400
    batch_size: PositiveInt = 100
    batch_wait_ms: float = Field(default=5.0, ge=0, le=1000)
    retry_delays: Annotated[tuple[PositiveInt, ...], NoDecode] = (1, 5, 30, 120)
    # Retries spread over this fraction of each tier's delay (0: none), in that many delay
    # queues per tier (service/core/topology.py).
    retry_jitter: float = 0.5
    retry_jitter_slots: int = 8
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
    # How far a worker's clock may be from the database's before the on-call hears
    # of it (expiry_clock_drift_seconds; deadlines use the database's clock only,
    # retry budgets the worker's).
    clock_drift_tolerance_seconds: PositiveFloat = 1.0
    scan_interval_seconds: PositiveFloat = 5.0
    # The event loop a command runs on: uvloop where it is installed (the uvloop extra;
    # the image has it), else asyncio's own.
    event_loop: Literal["auto", "uvloop", "asyncio"] = "auto"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["json", "text"] = "json"

    @field_validator("event_loop")
    @classmethod
    def _check_event_loop(cls, value: str) -> str:
        if value == "uvloop" and importlib.util.find_spec("uvloop") is None:
            raise ValueError("uvloop is not installed (pip install 'expiry-service[uvloop]')")
        return value

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

    @field_validator("retry_jitter")
    @classmethod
    def _check_jitter(cls, value: float) -> float:
        if not 0 <= value < 1:  # NaN fails too
            raise ValueError("must be a fraction >= 0 and < 1, e.g. 0.5 (0: no jitter)")
        return value

    @field_validator("retry_jitter_slots")
    @classmethod
    def _check_jitter_slots(cls, value: int) -> int:
        if not MIN_JITTER_SLOTS <= value <= MAX_JITTER_SLOTS:
            raise ValueError(
                f"must be a whole number from {MIN_JITTER_SLOTS} to {MAX_JITTER_SLOTS}, e.g. 8"
            )
        return value


class _Operators(BaseSettings):
    """Who may act on dead letters, who owns them, and the operator console."""

    # Who may replay dead letters (--operator must be one of them); empty: nobody.
    replay_operators: Annotated[tuple[str, ...], NoDecode] = ()
    # Who owns a dead letter when it is recorded: PATTERN=OWNER pairs matched in order
    # against its error class (service/core/default_owners.py); empty: nobody.
    dead_letter_owners: Annotated[tuple[OwnerRule, ...], NoDecode] = ()
    # How long a dead letter may stay open (expiry_dead_letter_age_objective_seconds).
    dead_letter_age_objective_seconds: PositiveFloat = 86400.0
    # The operator console (python -m service.console): where it listens (localhost
    # unless told otherwise), who may log in (name:scrypt-hash pairs, made with
    # `python -m service.console hash-password`), or the header a trusted reverse
    # proxy sets to the authenticated operator's name, and the key that signs the login
    # form's CSRF cookie (random per process when unset: a login form opened before a
    # restart must be reloaded). Sessions live in PostgreSQL and end after
    # CONSOLE_SESSION_IDLE_SECONDS without a request or CONSOLE_SESSION_MAX_SECONDS after
    # the login, whichever comes first. CONSOLE_LOGIN_ATTEMPTS failed logins for one name
    # from one address lock it for CONSOLE_LOGIN_LOCK_SECONDS (service/core/login_throttle.py).
    console_host: str = "127.0.0.1"
    console_port: int = Field(default=8090, ge=1, le=65535)
    console_users: Annotated[tuple[str, ...], NoDecode] = ()
    console_trusted_header: str | None = Field(default=None, pattern=r"^[A-Za-z0-9-]{1,64}$")
    console_secret: SecretStr | None = Field(default=None, min_length=32)
    console_session_idle_seconds: int = Field(default=1800, ge=60, le=30 * 86400)
    console_session_max_seconds: int = Field(default=8 * 3600, ge=60, le=30 * 86400)
    console_login_attempts: int = Field(default=10, ge=3, le=1000)
    console_login_lock_seconds: int = Field(default=900, ge=1, le=86400)

    @field_validator("replay_operators", mode="before")
    @classmethod
    def _split_operators(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("dead_letter_owners", mode="before")
    @classmethod
    def _parse_owners(cls, value: object) -> object:
        return parse_owner_rules(value) if isinstance(value, str) else value

    @field_validator("console_users", mode="before")
    @classmethod
    def _split_users(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("console_users")
    @classmethod
    def _check_users(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for entry in value:
            name, _, hashed = entry.partition(":")
            if not name or len(name) > OPERATOR_LIMIT or not name.isprintable():
                raise ValueError("each entry is NAME:HASH, the name printable, at most 64 long")
            if not hashed.startswith("scrypt$"):
                raise ValueError(
                    f"{name}: not a password hash (python -m service.console hash-password)"
                )
        return value

    @field_validator("replay_operators")
    @classmethod
    def _check_operators(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if len(name) > OPERATOR_LIMIT or not name.isprintable():
                raise ValueError(f"each name must be printable and at most {OPERATOR_LIMIT} long")
        return value


class _Events(BaseSettings):
    """The events other services learn of (../shared/CONTRACT.md, "Events"): the outbox
    the expiries write, and ``python -m service.relay``, which publishes it."""

    # A consumer wakes the relays (NOTIFY) after a commit that wrote events, at most once
    # in this many milliseconds (never inside the commit: docs/design.md, "Events").
    events_notify_ms: int = Field(default=10, ge=0, le=1000)
    # What a relay claims at once, how long its claim holds (a relay that has not marked
    # them sent by then loses them to the next claim, which publishes them again), and
    # how often it looks without being woken.
    relay_batch_size: int = Field(default=500, ge=1, le=10000)
    relay_lease_seconds: float = Field(default=30.0, ge=1, le=3600)
    relay_poll_seconds: float = Field(default=2.0, gt=0, le=300)
    # The age of the oldest pending event above which status says so (and the alert).
    events_objective_seconds: PositiveFloat = 60.0
    # An event no queue is bound for: kept pending until a reader binds one (keep), or
    # confirmed by the broker and dropped (drop: a deployment whose only readers are the
    # webhooks' endpoints, which would otherwise keep every event in the outbox).
    events_unroutable: Literal["keep", "drop"] = "keep"


class _Retention(BaseSettings):
    """How long the service keeps what it writes (``python -m service.retention``;
    docs/operations.md, "Retention", has the arithmetic)."""

    # The audit trail (transitions, dead-letter events and replays, console logins), and
    # dead letters closed or replayed, and ended console sessions: kept this many days at
    # least (the audit goes a whole week at a time, so up to 7 more).
    retention_days: int = Field(default=90, ge=7, le=36500)
    # Weekly partitions are made this far ahead of the clock.
    retention_ahead_days: int = Field(default=28, ge=14, le=366)
    # Working records (scan passes and retention runs of runners gone quiet, crash counters).
    retention_working_days: int = Field(default=7, ge=1, le=36500)


def _check_amqp_url(value: str) -> str:
    """Refuse what aio-pika would misread; never quote the URL (it may hold a password)."""
    parts = split_url(value, _AMQP_SCHEMES)  # a DsnError is a ValueError
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise _invalid_url("a port must be a number from 1 to 65535")
    if not parts.hostname:
        raise ValueError("has no host")
    check_amqp_tls(parts.scheme, parts.query)
    return value


def _invalid_url(what: str) -> ValueError:
    return ValueError(f"not a valid URL: {what} ({ENCODING_HINT})")
