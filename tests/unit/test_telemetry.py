"""Unit tests for service.telemetry: log lines carry facts and never passwords."""

from __future__ import annotations

import json
import logging

from service.telemetry import JsonFormatter, TextFormatter, redact


def _record(msg: str, **facts: object) -> logging.LogRecord:
    record = logging.LogRecord("service.x", logging.INFO, __file__, 1, msg, (), None)
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
