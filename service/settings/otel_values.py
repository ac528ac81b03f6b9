"""The forms of the standard ``OTEL_*`` values, each read as the library that reads it
reads it (``otel_variables.py`` says which variable has which form).

Each check raises ``ValueError`` with a message that never quotes the value. Where the
library has a public parser that raises, it is used (``Compression.from_str``,
``SpanLimits``, requests' URL and header checks); where its reader is private and logs
instead of raising, the check is the reader's own test, restated (``float``, ``int``,
a set of names, ``str.partition``); ``parse_env_headers`` logs too, and is used with its
warning silenced (it would print the header, secret and all).

The libraries are imported where a value is checked, so that reading the settings costs
nothing more when no such variable is set (``python -m service.healthcheck`` runs often).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Callable, Iterable, Iterator
from importlib.metadata import entry_points
from urllib.parse import urlsplit

from service.core.redaction import register_url_secrets

Check = Callable[[str], object]

_URL_FORM = (
    "an http:// or https:// URL with a host, and a port from 1 to 65535 if any "
    "(percent-encode @ : / % # ? in a user name or password)"
)
_SIGNAL_PATHS = ("/v1/traces", "/v1/metrics", "/v1/logs")
_HEADER_FORM = (
    "comma-separated name=value entries; in a value, percent-encode "
    "double quotes, commas, semicolons, backslashes and control characters"
)
# The OTEL_SEMCONV_STABILITY_OPT_IN entries the installed instrumentation knows (its
# _semconv._StabilityMode, private); it ignores any other without a word.
_SEMCONV_OPT_INS = ("http", "http/dup", "database", "database/dup", "gen_ai_latest_experimental")


def endpoint(value: str) -> None:
    """A URL the exporter's HTTP client (requests) can send to; its password is then
    redacted like the settings' URLs."""
    from requests.exceptions import RequestException
    from requests.models import PreparedRequest

    register_url_secrets(value)
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        raise ValueError(f"must be {_URL_FORM}") from None
    if parts.scheme not in ("http", "https") or port == 0:
        raise ValueError(f"must be {_URL_FORM}")
    try:
        PreparedRequest().prepare_url(value, None)  # a missing host, a bad port or IDNA name
    except RequestException:
        raise ValueError(f"must be {_URL_FORM}") from None


def base_endpoint(value: str) -> None:
    """The generic endpoint, to which the exporter adds ``/v1/traces`` (``/v1/metrics``)."""
    endpoint(value)
    if urlsplit(value.strip()).path.rstrip("/").endswith(_SIGNAL_PATHS):
        raise ValueError(
            "the exporter adds /v1/traces to it: give the collector's base URL "
            "(http://collector:4318), or the whole URL in OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
        )


def headers(value: str) -> None:
    """Each entry as the exporter reads it (``parse_env_headers``, liberal), then as
    requests would send it; entries are counted, never quoted (values are API keys)."""
    from opentelemetry.util.re import parse_env_headers
    from requests.exceptions import InvalidHeader
    from requests.utils import check_header_validity

    for number, entry in enumerate(value.split(","), start=1):
        if not entry.strip(" \t"):
            continue  # skipped by the exporter too
        with _silenced("opentelemetry.util.re"):
            parsed = parse_env_headers(entry, liberal=True)
        if not parsed:
            raise ValueError(f"entry {number} is not name=value ({_HEADER_FORM})")
        try:
            for header in parsed.items():
                check_header_validity(header)
        except InvalidHeader:
            raise ValueError(
                f"entry {number}: its value has leading whitespace or a line break "
                "(decoded), which HTTP does not allow"
            ) from None


@contextlib.contextmanager
def _silenced(logger_name: str) -> Iterator[None]:
    logger = logging.getLogger(logger_name)
    was, logger.disabled = logger.disabled, True
    try:
        yield
    finally:
        logger.disabled = was


def positive(parse: Callable[[str], float], what: str) -> Check:
    """A number as the library parses it (``float`` or ``int``; where that fails, it warns
    and takes its default), finite and > 0, as its use needs: a timeout of 0 fails every
    export, an interval of 0 exports nothing, a queue of 0 is refused."""

    def check(value: str) -> None:
        try:
            number = parse(value)
        except ValueError:
            number = math.nan
        if not (math.isfinite(number) and number > 0):
            raise ValueError(f"must be {what} > 0")

    return check


def whole_number(value: str) -> None:
    """A whole number as the batch span processor reads one (``int``)."""
    try:
        int(value)
    except ValueError:
        raise ValueError("must be a whole number of milliseconds") from None


def compression(value: str) -> None:
    """As the exporter reads it: ``Compression.from_str``."""
    from opentelemetry.exporter.otlp.common.http import Compression

    try:
        Compression.from_str(value)
    except ValueError:
        raise ValueError("must be none, gzip or deflate") from None


def protocol(value: str) -> None:
    """The service exports OTLP over HTTP with protobuf only, whatever this says (the
    exporter never reads it): asked for grpc or http/json, it would still send protobuf
    over HTTP, to an endpoint that expects something else."""
    if value.strip() != "http/protobuf":
        raise ValueError("must be http/protobuf, the only OTLP protocol the service speaks")


def existing_path(value: str) -> None:
    """A certificate or key file: requests fails every export without it."""
    if not os.path.exists(value):
        raise ValueError("no such file")


def plugins(group: str) -> Check:
    """The name of an installed entry point of ``group``, as the library loads it."""

    def check(value: str) -> None:
        _installed(group, [value])

    return check


def _installed(group: str, names: list[str]) -> None:
    known = entry_points(group=group).names
    if any(name not in known for name in names):
        raise ValueError(f"not installed (installed: {', '.join(sorted(known)) or 'none'})")


def propagators(value: str) -> None:
    """Names of installed propagators, up to a ``none``, as the API reads them (it raises
    at import for one it cannot find)."""
    names: list[str] = []
    for name in (part.strip() for part in value.split(",")):
        if name.lower() == "none":
            break
        names.append(name)
    _installed("opentelemetry_propagator", names)


def resource_detectors(value: str) -> None:
    """Names of installed resource detectors, or ``*`` for all of them (the SDK logs a
    traceback for one it cannot find, and goes on without it)."""
    names = [name.strip() for name in value.split(",") if name.strip() not in ("", "*")]
    _installed("opentelemetry_resource_detector", names)


def resource_attributes(value: str) -> None:
    """``key=value,...`` as the SDK's detector splits it: an entry without ``=`` is
    dropped (with a warning that quotes it), one without a key is an empty key."""
    for number, entry in enumerate(value.split(","), start=1):
        key, equals, _ = entry.partition("=")
        if not equals or not key.strip():
            raise ValueError(
                f"entry {number} is not key=value (comma-separated; percent-encode a comma "
                "in a value)"
            )


def one_of(choices: tuple[str, ...], fold: Callable[[str], str] = str) -> Check:
    """One of ``choices`` once ``fold`` is applied, as the library compares."""

    def check(value: str) -> None:
        if fold(value) not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")

    return check


def upper_stripped(value: str) -> str:
    """How the metric exporter folds its names."""
    return value.upper().strip()


def lower_stripped(value: str) -> str:
    """How the SDK folds a boolean."""
    return value.strip().lower()


def standard_boolean(value: str) -> bool:
    """The standard's boolean: ``true`` or ``false`` in any case (the SDK reads any other
    value as false); empty is false."""
    text = value.strip().lower()
    if text not in ("", "true", "false"):
        raise ValueError("must be true or false")
    return text == "true"


def semconv_opt_in(value: str) -> None:
    """Entries the installed instrumentation knows."""
    if any(entry.strip() not in ("", *_SEMCONV_OPT_INS) for entry in value.split(",")):
        raise ValueError(f"entries must be among {', '.join(_SEMCONV_OPT_INS)}")


def span_limit(argument: str, arguments: Iterable[str]) -> None:
    """The limit ``argument`` of ``SpanLimits`` as the SDK reads it from its variable (it
    raises for a bad one): the other ``arguments`` given as unset, so that it reads only
    that one."""
    from opentelemetry.sdk.trace import SpanLimits

    try:
        SpanLimits(**{other: SpanLimits.UNSET for other in arguments if other != argument})
    except ValueError:
        raise ValueError("must be a whole number >= 0 (empty: no limit)") from None
