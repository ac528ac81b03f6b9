"""Reading the settings: ``Settings``, the one model of every concern, read from the
environment (and ``.env``) once by ``load_settings``, which turns any refusal into one
``ConfigError`` line naming the variable: a bad value, an ``EXPIRY_*`` name that is no
setting, or an ``OTEL_*`` value the OpenTelemetry libraries would refuse, misread or drop.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable
from pathlib import Path

from dotenv import dotenv_values
from pydantic import AliasChoices, Field, ValidationError
from pydantic_settings import SettingsConfigDict

from service.core.errors import ConfigError
from service.settings.concerns import _Connections, _Events, _Operators, _Pipeline, _Retention
from service.settings.endpoints import _Webhooks
from service.settings.otel_variables import _Telemetry, otel_problem

ENV_PREFIX = "EXPIRY_"
ENV_FILE = ".env"


class Settings(_Webhooks, _Retention, _Events, _Operators, _Telemetry, _Pipeline, _Connections):
    """Every knob of the service (docs/reference.md has the table), by concern in seven
    classes (``concerns.py``, ``otel_variables.py``, ``endpoints.py``); one model, read
    from the environment once."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_file=ENV_FILE,
        env_file_encoding="utf-8",
        extra="ignore",
        frozen=True,
        validate_by_name=True,
    )

    # Test-only: makes a crash happen at a chosen point (see service/worker/failpoints.py,
    # and service/relay/exit_points.py for the relay's).
    failpoint: str = Field(
        default="",
        pattern=r"^(|exit-after-commit|exit-after-publish|exit-on:[0-9a-fA-F-]{36})$",
    )


_ENV_NAMES = {
    "database_url": "DATABASE_URL",
    "amqp_url": "AMQP_URL",
    "otel_traces_exporter": "OTEL_TRACES_EXPORTER",
    "otel_metrics_exporter": "OTEL_METRICS_EXPORTER",
    "otel_endpoint": "OTEL_EXPORTER_OTLP_ENDPOINT",
    "otel_sdk_disabled": "OTEL_SDK_DISABLED",
    "otel_traces_sampler": "OTEL_TRACES_SAMPLER",
    "otel_traces_sampler_arg": "OTEL_TRACES_SAMPLER_ARG",
}


def _setting_names() -> list[str]:
    """Every ``EXPIRY_*`` name that is a setting, then the names of the aliased ones."""
    prefixed = [
        f"{ENV_PREFIX}{name.upper()}"
        for name, field in Settings.model_fields.items()
        if field.validation_alias is None
    ]
    aliases = {
        choice
        for field in Settings.model_fields.values()
        if isinstance(field.validation_alias, AliasChoices)
        for choice in field.validation_alias.choices
        if isinstance(choice, str)
    }
    return prefixed + sorted(aliases)


def unknown_settings(names: Iterable[str]) -> list[str]:
    """One line for each ``EXPIRY_*`` name (any case) that is not a setting, with a hint.

    ``EXPIRY_DATABASE_URL`` and the like (which pydantic-settings would read as
    undocumented aliases) count as unknown: they point to the documented name.
    """
    known = _setting_names()
    problems = []
    for name in sorted(set(names)):
        if not name.upper().startswith(ENV_PREFIX) or name.upper() in known:
            continue
        hint = _closest(name.upper(), known)
        problems.append(f"{name}: unknown setting" + (f" (did you mean {hint}?)" if hint else ""))
    return problems


def _closest(name: str, known: list[str]) -> str | None:
    field = name.removeprefix(ENV_PREFIX).lower()
    if field in _ENV_NAMES:
        return _ENV_NAMES[field]
    close = difflib.get_close_matches(name, known, n=1)
    return close[0] if close else None


def process_environment() -> dict[str, str]:
    """This process's environment, as it is: for a child process to inherit, or for
    libpq's ``PG*`` defaults (settings come from ``load_settings`` only)."""
    return dict(os.environ)


def _environment_names() -> list[str]:
    names = list(os.environ)
    if Path(ENV_FILE).is_file():
        names += [name for name in dotenv_values(ENV_FILE, encoding="utf-8") if name]
    return names


def load_settings() -> Settings:
    """Read settings from the environment (and ``.env``), or raise ``ConfigError``.

    An ``EXPIRY_*`` variable that is no setting (a typo) is refused too, and so is an
    ``OTEL_*`` value that the OpenTelemetry libraries would refuse, misread or drop
    (``otel_variables.otel_problem``: they read this process's environment, not ``.env``).
    """
    present = _environment_names()
    if problems := unknown_settings(present):
        raise ConfigError("; ".join(problems))
    try:
        settings = Settings()
    except ValidationError as exc:
        error = exc.errors()[0]
        message = str(error["msg"]).removeprefix("Value error, ")
        if not error["loc"]:  # a check of several settings: its message names them
            raise ConfigError(message) from None
        raise ConfigError(f"{_variable_of(str(error['loc'][0]), present)}: {message}") from None
    if problem := otel_problem():
        raise ConfigError(problem)
    return settings


def _variable_of(field: str, present: Iterable[str]) -> str:
    """The variable a refused value came from: of a setting read under several names, the
    first one that is set."""
    upper = {name.upper() for name in present}
    for name, spec in Settings.model_fields.items():
        if not isinstance(spec.validation_alias, AliasChoices):
            continue
        choices = [c for c in spec.validation_alias.choices if isinstance(c, str)]
        if field.lower() == name or field.upper() in choices:
            return next((c for c in choices if c.upper() in upper), choices[0])
    return _ENV_NAMES.get(field.lower()) or (
        field if field.isupper() else f"{ENV_PREFIX}{field.upper()}"
    )
