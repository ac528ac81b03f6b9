"""Settings: the only reader of the environment.

``DATABASE_URL`` and ``AMQP_URL`` keep their contract names; everything else has the
``EXPIRY_`` prefix and a documented default (docs/reference.md has the table), except the
standard ``OTEL_*`` variables, which keep their standard meaning.

By responsibility: ``concerns`` (what the ``EXPIRY_*`` settings and the contract's URLs
accept), ``otel_variables`` with ``otel_values`` (the standard's variables: those the
service reads, and those only the OpenTelemetry libraries read, checked all the same),
``webhooks`` (the endpoints of HTTP delivery), and ``loading`` (the one model,
``load_settings``, the names). Import from here.
"""

from service.core.errors import ConfigError
from service.core.redaction import redact_url
from service.settings.concerns import MAX_JITTER_SLOTS, MIN_JITTER_SLOTS, OPERATOR_LIMIT
from service.settings.endpoints import Endpoint
from service.settings.loading import (
    ENV_FILE,
    ENV_PREFIX,
    Settings,
    load_settings,
    process_environment,
    unknown_settings,
)

__all__ = [
    "ENV_FILE",
    "ENV_PREFIX",
    "MAX_JITTER_SLOTS",
    "MIN_JITTER_SLOTS",
    "OPERATOR_LIMIT",
    "ConfigError",
    "Endpoint",
    "Settings",
    "load_settings",
    "process_environment",
    "redact_url",
    "unknown_settings",
]
