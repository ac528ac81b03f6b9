"""Unit tests for the standard OTEL_* variables in service.settings: each value the
service or the OpenTelemetry libraries read is checked at start, a bad one is one line
naming it, and no line quotes a secret."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import environment_variables as api_variables
from opentelemetry.instrumentation import environment_variables as instrumentation_variables
from opentelemetry.sdk import environment_variables as sdk_variables

from service.core.errors import ConfigError
from service.core.redaction import forget_secrets, redact
from service.settings import Settings, load_settings
from service.settings.otel_variables import BSP_DEFAULTS, RULES, SPAN_LIMITS

ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
SAMPLER_ARG = "OTEL_TRACES_SAMPLER_ARG"
TIMEOUT = "OTEL_EXPORTER_OTLP_TIMEOUT"
HEADERS = "OTEL_EXPORTER_OTLP_HEADERS"
URL_FORM = "must be an http:// or https:// URL with a host"


@pytest.fixture(autouse=True)
def _no_otel_variables(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No OTEL_* of the shell changes what a test sees; secrets registered are forgotten."""
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    forget_secrets()
    yield
    forget_secrets()


def _refusal(monkeypatch: pytest.MonkeyPatch, **variables: str) -> str:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = str(caught.value)
    assert "\n" not in message
    return message


def _loaded(monkeypatch: pytest.MonkeyPatch, **variables: str) -> Settings:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    return load_settings()


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (ENDPOINT, "collector:4318", URL_FORM),  # no scheme: every span lost
        (ENDPOINT, "localhost:4318", URL_FORM),
        (ENDPOINT, "grpc://collector:4317", URL_FORM),
        (ENDPOINT, "http://:4318", URL_FORM),
        (ENDPOINT, "http://collector:http", URL_FORM),
        (ENDPOINT, "http://collector:99999", URL_FORM),
        (ENDPOINT, "http://collector:0", URL_FORM),
        (ENDPOINT, "http://[::1:4318", URL_FORM),
        (ENDPOINT, "http://collector:4318/v1/traces", "the exporter adds /v1/traces to it"),
        (TRACES_ENDPOINT, "collector:4318/v1/traces", URL_FORM),
        ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "ftp://collector/", URL_FORM),
        (SAMPLER_ARG, "1.5", "Input should be less than or equal to 1"),
        (SAMPLER_ARG, "-0.1", "Input should be greater than or equal to 0"),
        (SAMPLER_ARG, "half", "Input should be a valid number"),
        (SAMPLER_ARG, "nan", "Input should be"),
        (TIMEOUT, "ten", "must be a number of seconds > 0"),  # the exporter: 10 s, a warning
        (TIMEOUT, "10s", "must be a number of seconds > 0"),
        (TIMEOUT, "0", "must be a number of seconds > 0"),
        (TIMEOUT, "-1", "must be a number of seconds > 0"),
        (TIMEOUT, "nan", "must be a number of seconds > 0"),
        (TIMEOUT, "inf", "must be a number of seconds > 0"),
        ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "soon", "must be a number of seconds > 0"),
        (HEADERS, "api-key", "entry 1 is not name=value"),
        (HEADERS, "a=1,b", "entry 2 is not name=value"),
        (HEADERS, 'a="quoted"', "entry 1 is not name=value"),
        (HEADERS, "a=line%0Abreak", "entry 1: its value has leading whitespace or a line"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd", "must be none, gzip or deflate"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc", "must be http/protobuf"),
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json", "must be http/protobuf"),
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/no/such/ca.pem", "no such file"),
        ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE", "/no/such.pem", "no such file"),
        ("OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER", "vault", "not installed"),
        ("OTEL_TRACES_EXPORTER", "zipkin", "Input should be 'otlp', 'console' or 'none'"),
        ("OTEL_TRACES_EXPORTER", "otlp,console", "Input should be"),
        ("OTEL_METRICS_EXPORTER", "statsd", "Input should be"),
        ("OTEL_TRACES_SAMPLER", "jaeger_remote", "Input should be"),
        ("OTEL_SDK_DISABLED", "yes", "must be true or false"),
        ("OTEL_SDK_DISABLED", "1", "must be true or false"),
        ("OTEL_RESOURCE_ATTRIBUTES", "team=holds,prod", "entry 2 is not key=value"),
        ("OTEL_RESOURCE_ATTRIBUTES", "=holds", "entry 1 is not key=value"),
        ("OTEL_RESOURCE_ATTRIBUTES", "team=holds,", "entry 2 is not key=value"),
        ("OTEL_EXPERIMENTAL_RESOURCE_DETECTORS", "host,kubernetes", "not installed"),
        ("OTEL_PROPAGATORS", "tracecontext,b3", "not installed (installed: baggage,"),
        ("OTEL_PROPAGATORS", "tracecontext,,baggage", "not installed"),
        ("OTEL_PYTHON_CONTEXT", "threadlocal", "not installed"),
        ("OTEL_PYTHON_TRACER_PROVIDER", "", "not installed"),
        ("OTEL_PYTHON_METER_PROVIDER", "mine", "not installed"),
        ("OTEL_SPAN_EVENT_COUNT_LIMIT", "-1", "must be a whole number >= 0"),
        ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "4k", "must be a whole number >= 0"),
        ("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "many", "must be a whole number >= 0"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "0", "must be a whole number > 0"),
        ("OTEL_BSP_SCHEDULE_DELAY", "", "must be a whole number > 0"),
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4096", "the export batch (OTEL_BSP_MAX_EXPORT"),
        ("OTEL_BSP_EXPORT_TIMEOUT", "30s", "must be a whole number of milliseconds"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "0", "must be a number of milliseconds > 0"),
        ("OTEL_METRIC_EXPORT_TIMEOUT", "half a minute", "must be a number of milliseconds"),
        ("OTEL_METRICS_EXEMPLAR_FILTER", "ALWAYS_ON", "must be one of trace_based,"),
        ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "gauge", "must be one of"),
        ("OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION", "sum", "must be one of"),
        ("OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED", "on", "must be one of true, false"),
        ("OTEL_SEMCONV_STABILITY_OPT_IN", "databse", "entries must be among http,"),
    ],
)
def test_a_bad_otel_value_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    """Whether the service reads it or only the libraries do, a value they would refuse,
    misread or drop stops the command: one line, the variable's name first."""
    assert _refusal(monkeypatch, **{name: value}).startswith(f"{name}: {message}")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        (ENDPOINT, "http://collector:4318"),
        (ENDPOINT, "https://otlp.example.com/otlp/"),  # a base path: /v1/traces follows it
        (ENDPOINT, "http://[::1]:4318"),
        (ENDPOINT, "HTTPS://user:p%40ss@collector"),
        (ENDPOINT, ""),  # empty is unset
        (TRACES_ENDPOINT, "http://collector:4318/v1/traces"),
        (SAMPLER_ARG, "0"),
        (SAMPLER_ARG, "1"),
        (SAMPLER_ARG, " 0.25 "),
        (SAMPLER_ARG, ""),
        (TIMEOUT, "10"),
        (TIMEOUT, "2.5"),
        (TIMEOUT, ""),
        (HEADERS, "api-key=abc123,x-scope=prod"),
        (HEADERS, "Authorization=Basic%20dXNlcjpwYXNz"),  # percent-encoded, as the standard
        (HEADERS, "authorization=Bearer abc123 , x-a=b,"),  # liberal, as the exporter
        (HEADERS, "a=b=c"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "GZIP"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_TRACES_EXPORTER", "OTLP"),
        ("OTEL_TRACES_EXPORTER", ""),
        ("OTEL_TRACES_SAMPLER", "ParentBased_TraceIdRatio"),
        ("OTEL_SDK_DISABLED", "False"),
        ("OTEL_SDK_DISABLED", ""),
        ("OTEL_RESOURCE_ATTRIBUTES", "service.name=holds,deployment.environment=prod"),
        ("OTEL_RESOURCE_ATTRIBUTES", "note=a%2Cb=c"),
        ("OTEL_EXPERIMENTAL_RESOURCE_DETECTORS", "host, process,*"),
        ("OTEL_PROPAGATORS", "tracecontext, baggage"),
        ("OTEL_PROPAGATORS", "none"),
        ("OTEL_PYTHON_TRACER_PROVIDER", "sdk_tracer_provider"),
        ("OTEL_SPAN_EVENT_COUNT_LIMIT", "0"),
        ("OTEL_SPAN_EVENT_COUNT_LIMIT", ""),  # the SDK's "no limit"
        ("OTEL_BSP_MAX_QUEUE_SIZE", "4096"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "15000"),
        ("OTEL_METRICS_EXEMPLAR_FILTER", "always_off"),
        ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", " delta"),
        ("OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED", "TRUE"),
        ("OTEL_SEMCONV_STABILITY_OPT_IN", "database/dup,http"),
        ("OTEL_SERVICE_NAME", "holds-eu"),
    ],
)
def test_a_good_otel_value_is_accepted(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    """The standard's forms, as the installed libraries read them, load."""
    _loaded(monkeypatch, **{name: value})


def test_the_values_the_service_reads_are_read_as_the_standard_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Names in any case, a ratio as a number, empty as unset, true in any case."""
    settings = _loaded(
        monkeypatch,
        OTEL_TRACES_SAMPLER="ParentBased_TraceIdRatio",
        OTEL_TRACES_SAMPLER_ARG="0.25",
        OTEL_TRACES_EXPORTER="Console",
        OTEL_METRICS_EXPORTER="",
        OTEL_SDK_DISABLED="TRUE",
    )
    assert settings.otel_traces_sampler == "parentbased_traceidratio"
    assert settings.otel_traces_sampler_arg == 0.25
    assert (settings.otel_traces_exporter, settings.otel_metrics_exporter) == ("console", None)
    assert settings.otel_sdk_disabled is True
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "")
    settings = load_settings()
    assert (settings.otel_traces_sampler_arg, settings.otel_sdk_disabled) == (None, False)


def test_certificate_files_that_exist_are_accepted(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A CA bundle, a client certificate and its key, by the paths requests reads."""
    for name in ("ca.pem", "client.pem", "client.key"):
        (tmp_path / name).write_text("-----BEGIN-----\n")
    _loaded(
        monkeypatch,
        OTEL_EXPORTER_OTLP_CERTIFICATE=str(tmp_path / "ca.pem"),
        OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE=str(tmp_path / "client.pem"),
        OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY=str(tmp_path / "client.key"),
    )


def test_a_client_key_without_a_certificate_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The exporter would send no client certificate, and drop the key without a word."""
    (tmp_path / "client.key").write_text("-----BEGIN-----\n")
    message = _refusal(monkeypatch, OTEL_EXPORTER_OTLP_CLIENT_KEY=str(tmp_path / "client.key"))
    assert message.startswith(
        "OTEL_EXPORTER_OTLP_CLIENT_KEY: set without OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"
    )


def test_a_batch_larger_than_the_queue_names_what_was_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The batch span processor raises for it: the queue is named when only it was set."""
    message = _refusal(monkeypatch, OTEL_BSP_MAX_QUEUE_SIZE="100")
    assert message.startswith("OTEL_BSP_MAX_QUEUE_SIZE: the export batch")
    _loaded(monkeypatch, OTEL_BSP_MAX_EXPORT_BATCH_SIZE="100")


SECRET = "Xq7ApiKeyZk9"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        (HEADERS, f"api-key={SECRET},broken"),
        (HEADERS, f'api-key="{SECRET}"'),
        (HEADERS, f"api-key={SECRET}%0Abreak"),
        ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", f"authorization=Bearer {SECRET};x"),
        (ENDPOINT, f"https://user:{SECRET}@:4318"),
        (ENDPOINT, f"https://user:{SECRET}@collector:4318/v1/traces"),
        (TRACES_ENDPOINT, f"collector://user:{SECRET}@h/v1/traces"),
    ],
)
def test_a_secret_in_a_bad_value_is_never_shown(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    name: str,
    value: str,
) -> None:
    """Neither the line nor the library's own warning (which quotes a bad header) shows an
    API key or an endpoint's password."""
    caplog.set_level(logging.DEBUG)
    message = _refusal(monkeypatch, **{name: value})
    assert message.startswith(f"{name}: ")
    captured = capsys.readouterr()
    for text in (message, captured.out, captured.err, caplog.text):
        assert SECRET not in text


def test_an_endpoints_password_is_redacted_once_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Like DATABASE_URL's: wherever it appears afterwards, it is masked."""
    _loaded(monkeypatch, OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=f"https://u:{SECRET}@c/v1/metrics")
    assert redact(f"export failed: {SECRET}") == "export failed: ***"


def test_every_checked_name_is_one_the_installed_libraries_read() -> None:
    """No name in the rules is a typo: each is one of the libraries' own constants."""
    known = {
        value
        for module in (sdk_variables, api_variables, instrumentation_variables)
        for value in vars(module).values()
        if isinstance(value, str) and value.startswith("OTEL_")
    }
    checked = set(RULES) | set(SPAN_LIMITS.values()) | set(BSP_DEFAULTS)
    assert checked - known == set()
