"""The standard ``OTEL_*`` variables: those the service reads itself (``_Telemetry``, a
concern of ``Settings``), and those only the OpenTelemetry libraries read (``otel_problem``):
the SDK, its OTLP/HTTP exporter, the API and the instrumentation.

The libraries read ``os.environ`` when they build what the service asks for, and mostly
log and go on: a timeout that is no number becomes 10 s with a warning in the span
export child, an endpoint that is no http(s) URL loses every span, a header that is not
``name=value`` is dropped with a warning that quotes it, API key and all; a bad span
limit or propagator is a traceback. So each value is checked at start, by the library's
own parser where it has a public one (``otel_values.py``), and a value it would refuse,
misread or drop stops the command with one line naming it. A line never quotes the
value: endpoints may carry credentials, and headers API keys.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal, NamedTuple

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings

from service.settings import otel_values as values

# The exporter's generic variables, then each signal's (which win); the service exports no
# logs, so the logs' variables are not read.
SIGNALS = ("", "TRACES_", "METRICS_")


class _Telemetry(BaseSettings):
    """The standard OpenTelemetry variables the service reads itself: which exporters, the
    sampler, whether the SDK is off. As the standard says, an empty value is unset, and
    names are read in any case (as the SDK reads the sampler's)."""

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
    # Which traces are kept, by the standard's names; unset: parentbased_always_on.
    otel_traces_sampler: (
        Literal[
            "always_on",
            "always_off",
            "traceidratio",
            "parentbased_always_on",
            "parentbased_always_off",
            "parentbased_traceidratio",
        ]
        | None
    ) = Field(default=None, validation_alias=AliasChoices("OTEL_TRACES_SAMPLER"))
    otel_traces_sampler_arg: float | None = Field(
        default=None, ge=0, le=1, validation_alias=AliasChoices("OTEL_TRACES_SAMPLER_ARG")
    )

    @field_validator(
        "otel_traces_exporter", "otel_metrics_exporter", "otel_traces_sampler", mode="before"
    )
    @classmethod
    def _name_in_any_case(cls, value: object) -> object:
        return (value.strip().lower() or None) if isinstance(value, str) else value

    @field_validator("otel_traces_sampler_arg", "otel_endpoint", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("otel_endpoint")
    @classmethod
    def _check_endpoint(cls, value: str | None) -> str | None:
        if value is not None:
            values.endpoint(value)  # raises ValueError, never quoting the URL
        return value

    @field_validator("otel_sdk_disabled", mode="before")
    @classmethod
    def _standard_boolean(cls, value: object) -> object:
        return values.standard_boolean(value) if isinstance(value, str) else value


class _Rule(NamedTuple):
    """How one variable is checked: ``check`` raises ValueError for a value the library
    would refuse, misread or drop; ``empty_is_unset``: the library reads an empty value
    as unset (else it is checked, and refused where the library would choke on it)."""

    check: values.Check
    empty_is_unset: bool = True


def _exporter_rules() -> dict[str, _Rule]:
    """The OTLP/HTTP exporter's variables (an empty one is unset: it reads them with ``or``)."""
    rules: dict[str, _Rule] = {}
    for signal in SIGNALS:
        prefix = f"OTEL_EXPORTER_OTLP_{signal}"
        rules |= {
            f"{prefix}ENDPOINT": _Rule(values.endpoint if signal else values.base_endpoint),
            f"{prefix}HEADERS": _Rule(values.headers),
            f"{prefix}TIMEOUT": _Rule(values.positive(float, "a number of seconds")),
            f"{prefix}COMPRESSION": _Rule(values.compression),
            f"{prefix}PROTOCOL": _Rule(values.protocol),
            f"{prefix}CERTIFICATE": _Rule(values.existing_path),
            f"{prefix}CLIENT_KEY": _Rule(values.existing_path),
            f"{prefix}CLIENT_CERTIFICATE": _Rule(values.existing_path),
            f"OTEL_PYTHON_EXPORTER_OTLP_HTTP_{signal}CREDENTIAL_PROVIDER": _Rule(
                values.plugins("opentelemetry_otlp_credential_provider")
            ),
        }
    return rules


_WHOLE = values.positive(int, "a whole number")
_MILLIS = values.positive(float, "a number of milliseconds")
# The SDK's, the API's and the instrumentation's variables the service's setup reads (the
# span limits are _span_limits_problem's).
_SDK_RULES = {
    "OTEL_RESOURCE_ATTRIBUTES": _Rule(values.resource_attributes),
    "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS": _Rule(values.resource_detectors),
    "OTEL_PROPAGATORS": _Rule(values.propagators),
    "OTEL_PYTHON_CONTEXT": _Rule(values.plugins("opentelemetry_context")),
    "OTEL_PYTHON_TRACER_PROVIDER": _Rule(
        values.plugins("opentelemetry_tracer_provider"), empty_is_unset=False
    ),
    "OTEL_PYTHON_METER_PROVIDER": _Rule(
        values.plugins("opentelemetry_meter_provider"), empty_is_unset=False
    ),
    "OTEL_BSP_SCHEDULE_DELAY": _Rule(_WHOLE, empty_is_unset=False),
    "OTEL_BSP_MAX_QUEUE_SIZE": _Rule(_WHOLE, empty_is_unset=False),
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": _Rule(_WHOLE, empty_is_unset=False),
    "OTEL_BSP_EXPORT_TIMEOUT": _Rule(values.whole_number, empty_is_unset=False),
    "OTEL_METRIC_EXPORT_INTERVAL": _Rule(_MILLIS, empty_is_unset=False),
    "OTEL_METRIC_EXPORT_TIMEOUT": _Rule(_MILLIS, empty_is_unset=False),
    "OTEL_METRICS_EXEMPLAR_FILTER": _Rule(
        values.one_of(("trace_based", "always_on", "always_off")), empty_is_unset=False
    ),
    "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": _Rule(
        values.one_of(("CUMULATIVE", "DELTA", "LOWMEMORY"), values.upper_stripped),
        empty_is_unset=False,
    ),
    "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION": _Rule(
        values.one_of(
            ("EXPLICIT_BUCKET_HISTOGRAM", "BASE2_EXPONENTIAL_BUCKET_HISTOGRAM"),
            values.upper_stripped,
        ),
        empty_is_unset=False,
    ),
    "OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED": _Rule(
        values.one_of(("true", "false"), values.lower_stripped), empty_is_unset=False
    ),
    "OTEL_SEMCONV_STABILITY_OPT_IN": _Rule(values.semconv_opt_in),
}


RULES: Mapping[str, _Rule] = _exporter_rules() | _SDK_RULES
# SpanLimits' arguments and the variables each reads when it is not given.
SPAN_LIMITS = {
    "max_attributes": "OTEL_ATTRIBUTE_COUNT_LIMIT",
    "max_events": "OTEL_SPAN_EVENT_COUNT_LIMIT",
    "max_links": "OTEL_SPAN_LINK_COUNT_LIMIT",
    "max_span_attributes": "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT",
    "max_event_attributes": "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT",
    "max_link_attributes": "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT",
    "max_attribute_length": "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",
    "max_span_attribute_length": "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT",
}
# The batch span processor's defaults, the standard's (it refuses a batch over its queue).
BSP_DEFAULTS = {"OTEL_BSP_MAX_QUEUE_SIZE": 2048, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": 512}


def otel_problem() -> str | None:
    """``NAME: why`` for the first ``OTEL_*`` variable of this process's environment that
    the OpenTelemetry libraries would refuse, misread or drop; ``None`` if there is none."""
    environ = os.environ
    for name, rule in RULES.items():
        value = environ.get(name)
        if value is None or (rule.empty_is_unset and not value):
            continue
        try:
            rule.check(value)
        except ValueError as exc:
            return f"{name}: {exc}"
    return _span_limits_problem(environ) or _batch_problem(environ) or _key_problem(environ)


def _span_limits_problem(environ: Mapping[str, str]) -> str | None:
    """Each span limit as the SDK reads it (``SpanLimits``, public; it raises), one at a
    time: the other arguments given as unset, so that only the one variable is read.

    First each as the SDK's module reads some of them as it is imported (a whole number
    >= 0, or empty: no limit), since importing it with a bad one raises, quoting it."""
    for name in SPAN_LIMITS.values():
        text = environ.get(name, "").strip()
        if text and not (text.isdigit() and text.isascii()):
            return f"{name}: must be a whole number >= 0 (empty: no limit)"
    for argument, name in SPAN_LIMITS.items():
        if name in environ:
            try:
                values.span_limit(argument, SPAN_LIMITS)
            except ValueError as exc:
                return f"{name}: {exc}"
    return None


def _batch_problem(environ: Mapping[str, str]) -> str | None:
    """The batch span processor refuses (raises) an export batch larger than its queue."""
    queue, batch = (int(environ.get(name) or default) for name, default in BSP_DEFAULTS.items())
    if batch <= queue:
        return None
    name = next((n for n in reversed(BSP_DEFAULTS) if n in environ), "OTEL_BSP_MAX_QUEUE_SIZE")
    return (
        f"{name}: the export batch (OTEL_BSP_MAX_EXPORT_BATCH_SIZE, 512 when unset) must not "
        "exceed the queue (OTEL_BSP_MAX_QUEUE_SIZE, 2048 when unset)"
    )


def _key_problem(environ: Mapping[str, str]) -> str | None:
    """A client key without a client certificate: the exporter would drop the key."""
    for signal in SIGNALS:
        key = f"OTEL_EXPORTER_OTLP_{signal}CLIENT_KEY"
        certificates = (f"OTEL_EXPORTER_OTLP_{signal}CLIENT_CERTIFICATE",) + (
            ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",) if signal else ()
        )
        if environ.get(key) and not any(environ.get(name) for name in certificates):
            return f"{key}: set without {certificates[0]}: the exporter would ignore the key"
    return None
