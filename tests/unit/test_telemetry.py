"""Unit tests for service.adapters.telemetry: log lines carry facts and never passwords."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from urllib.parse import quote

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.sampling import Decision

from service.adapters import telemetry
from service.adapters.telemetry.logs import JsonFormatter, TextFormatter
from service.core.redaction import forget_secrets, redact, register_url_secrets
from service.settings import load_settings


def _record(msg: str, *args: object, **facts: object) -> logging.LogRecord:
    record = logging.LogRecord("service.x", logging.INFO, __file__, 1, msg, args, None)
    for key, value in facts.items():
        setattr(record, key, value)
    return record


def test_json_line_has_event_and_facts() -> None:
    """One JSON object: the stable event name plus the extra facts."""
    line = JsonFormatter().format(_record("expiry.outcome", outcome="expired", attempt=2))
    entry = json.loads(line)
    assert (entry["event"], entry["outcome"], entry["attempt"]) == ("expiry.outcome", "expired", 2)


def test_passwords_in_urls_are_redacted_everywhere() -> None:
    """A URL with credentials in a message is masked in both formats."""
    record = _record("cannot reach amqp://svc:hunter2@rabbit:5672/prod")
    assert "hunter2" not in JsonFormatter().format(record)
    assert "hunter2" not in TextFormatter().format(record)
    assert (
        redact("postgresql://a:b@h/db and amqp://c:d@e/")
        == "postgresql://a:***@h/db and amqp://c:***@e/"
    )


@pytest.fixture
def known_secret() -> Iterator[str]:
    """A password registered as the settings register it; forgotten afterwards."""
    forget_secrets()
    register_url_secrets("postgresql://app:pa%40ss%2Fw0rd@db/app")
    yield "pa@ss/w0rd"
    forget_secrets()


def _failing_record(msg: str, exc: BaseException, **facts: object) -> logging.LogRecord:
    record = _record(msg, **facts)
    record.exc_info = (type(exc), exc, None)
    return record


PASSWORD = "p@ss:w/rd%#?"
URL = f"amqp://svc:{PASSWORD}@rabbit:5672/prod"
ENCODED_URL = f"amqp://svc:{quote(PASSWORD, safe='')}@rabbit:5672/prod"


class _Node:
    def __str__(self) -> str:
        return ENCODED_URL


@pytest.mark.parametrize("formatter", [JsonFormatter(), TextFormatter()], ids=["json", "text"])
@pytest.mark.parametrize(
    "record",
    [
        _record(f"cannot reach {URL}"),
        _record("cannot reach %s", ENCODED_URL),
        _record("broker.unreachable", url=URL, error=f"refused by {ENCODED_URL}"),
        _record("broker.unreachable", nodes=[URL, {"url": ENCODED_URL}]),
        _record("broker.unreachable", node=_Node()),
        _failing_record("broker.failed", ConnectionError(f"cannot reach {URL}")),
    ],
    ids=["event", "event-args", "fact", "nested-fact", "object-fact", "exception"],
)
def test_no_password_in_any_part_of_a_line(
    formatter: logging.Formatter, record: logging.LogRecord
) -> None:
    """The event, every fact (nested, objects) and the exception are redacted, in both formats."""
    line = formatter.format(record)
    for form in (PASSWORD, quote(PASSWORD, safe=""), "p@ss", "w/rd"):
        assert form not in line
    assert "svc:***@rabbit:5672/prod" in line
    if isinstance(formatter, JsonFormatter):
        json.loads(line)


@pytest.mark.parametrize("formatter", [JsonFormatter(), TextFormatter()], ids=["json", "text"])
def test_a_known_secret_goes_even_outside_a_url(
    formatter: logging.Formatter, known_secret: str
) -> None:
    """A registered password is removed wherever it shows, not only inside URLs."""
    record = _failing_record(
        "db.failed", ValueError(f"bad {known_secret}"), reason=f"said {known_secret}"
    )
    line = formatter.format(record)
    assert known_secret not in line
    assert "said ***" in line
    assert "bad ***" in line


def test_a_line_without_secrets_is_unchanged(known_secret: str) -> None:
    """The fast path leaves an ordinary line as it was (a uuid fact as its text)."""
    rid = uuid.uuid4()
    line = JsonFormatter().format(_record("expiry.outcome", reservation_id=rid, outcome="expired"))
    entry = json.loads(line)
    assert (entry["reservation_id"], entry["outcome"]) == (str(rid), "expired")


def test_a_line_that_cannot_be_formatted_leaks_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    """A log call with bad arguments writes one line naming the event, never the arguments."""
    import logging

    from service.adapters.telemetry import setup_logging

    root = logging.getLogger()
    saved = root.handlers[:], root.level
    setup_logging("INFO", "json")
    try:
        logging.getLogger("test").info("bad.%s %s", "amqp://u:secretpassword@host/")
    finally:
        root.handlers[:], root.level = saved[0], saved[1]
    err = capsys.readouterr().err
    assert "log line lost: bad.%s %s (TypeError)" in err
    assert "secretpassword" not in err


@pytest.mark.parametrize(
    ("env", "name"),
    [
        ({}, "expiry-service"),
        ({"OTEL_SERVICE_NAME": "holds-eu"}, "holds-eu"),
        (
            {"OTEL_RESOURCE_ATTRIBUTES": "service.name=holds-us,deployment.environment=prod"},
            "holds-us",
        ),
        ({"OTEL_SERVICE_NAME": "a", "OTEL_RESOURCE_ATTRIBUTES": "service.name=b"}, "a"),
    ],
)
def test_the_standard_variables_win_over_our_resource_defaults(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], name: str
) -> None:
    """OTEL_SERVICE_NAME, then service.name in OTEL_RESOURCE_ATTRIBUTES, then ours."""
    for key in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    attributes = dict(telemetry.resource_for("consume", "w1").attributes)
    assert attributes["service.name"] == name
    assert (attributes["service.instance.id"], attributes["expiry.role"]) == ("w1", "consume")
    if "deployment.environment" in env.get("OTEL_RESOURCE_ATTRIBUTES", ""):
        assert attributes["deployment.environment"] == "prod"


SAMPLED = (Decision.RECORD_AND_SAMPLE,)


@pytest.mark.parametrize(
    ("name", "arg", "roots_kept"),
    [
        (None, None, 1.0),
        ("always_off", None, 0.0),
        ("traceidratio", "0.1", 0.1),
        ("parentbased_traceidratio", "0.1", 0.1),
        ("parentbased_traceidratio", None, 1.0),
        ("parentbased_always_off", None, 0.0),
    ],
)
def test_the_sampler_is_the_standard_variables(
    monkeypatch: pytest.MonkeyPatch, name: str | None, arg: str | None, roots_kept: float
) -> None:
    """OTEL_TRACES_SAMPLER and its argument choose the sampler as the standard says: of
    10,000 root traces about the ratio is kept; under a sampled parent, parentbased_*
    always keeps the child."""
    for variable, value in (("OTEL_TRACES_SAMPLER", name), ("OTEL_TRACES_SAMPLER_ARG", arg)):
        if value is None:
            monkeypatch.delenv(variable, raising=False)
        else:
            monkeypatch.setenv(variable, value)
    sampler = telemetry.sampler_for(load_settings())
    kept = sum(
        sampler.should_sample(None, uuid.uuid4().int >> 64, "consume").decision in SAMPLED
        for _ in range(10_000)
    )
    assert abs(kept / 10_000 - roots_kept) < 0.02
    if name is not None and name.startswith("parentbased") and name != "parentbased_always_off":
        parent = trace.set_span_in_context(
            trace.NonRecordingSpan(
                trace.SpanContext(1, 2, is_remote=True, trace_flags=trace.TraceFlags(1))
            )
        )
        assert sampler.should_sample(parent, 1, "consume").decision in SAMPLED
