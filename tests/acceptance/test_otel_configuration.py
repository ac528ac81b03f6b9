"""A bad standard OTEL_* value stops a command at start, as a bad EXPIRY_* one does: one
line naming it, exit 2, no traceback, no secret (``python -m service.consume``, which
fails at its configuration before it connects to anything)."""

from __future__ import annotations

import pytest

from tests.acceptance.processes import base_env, run

pytestmark = pytest.mark.acceptance

SECRET = "hunter2OtlpKey"
# Nothing listens there: a value wrongly accepted fails the test at once (exit 1).
CLOSED = {"DATABASE_URL": "postgresql://nobody@127.0.0.1:9/none", "AMQP_URL": "amqp://127.0.0.1:9/"}


@pytest.mark.parametrize(
    ("name", "value"),
    [
        # Before: accepted; the export child's exporter lost every span without a word.
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", f"https://otlp:{SECRET}@collector:4318/v1/traces"),
        # Before too, one line (the service reads it itself): kept so.
        ("OTEL_TRACES_SAMPLER_ARG", "1.5"),
        # Before: a warning line from the export child, and 10 s instead.
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "ten"),
        # Before: the entry dropped, with a warning from the child quoting it.
        ("OTEL_EXPORTER_OTLP_HEADERS", f"api-key={SECRET},broken"),
        # Before: accepted, and read only where the SDK's objects are made.
        ("OTEL_BSP_MAX_QUEUE_SIZE", "0"),
        ("OTEL_METRICS_EXEMPLAR_FILTER", "sometimes"),
        # Before: a traceback quoting the value, as the SDK read them while it was imported.
        ("OTEL_PROPAGATORS", f"tracecontext,{SECRET}"),
        ("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", SECRET),
    ],
)
def test_a_bad_otel_value_is_one_line_and_exit_2(name: str, value: str) -> None:
    """Exactly one line on stderr, naming the variable; never the secret it holds."""
    env = {k: v for k, v in base_env().items() if not k.startswith("OTEL_")}
    result = run("service.consume", env={**env, **CLOSED, name: value}, timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"python -m service.consume: configuration error: {name}: ")
    assert SECRET not in result.stderr + result.stdout
