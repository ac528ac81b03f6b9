"""Unit tests for service.settings: defaults, one-line errors, redaction."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from service.core.errors import ConfigError
from service.core.redaction import forget_secrets, redact
from service.settings import load_settings, redact_url


@pytest.fixture(autouse=True)
def _no_service_urls(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The CI's DATABASE_URL and AMQP_URL must not change what defaults look like;
    passwords registered by one test are forgotten after it."""
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("AMQP_URL", raising=False)
    forget_secrets()
    yield
    forget_secrets()


def test_defaults_follow_the_contract() -> None:
    """With nothing set, the contract's local services are used."""
    settings = load_settings()
    assert settings.database_url == "postgresql://postgres@localhost:5432/postgres"
    assert settings.amqp_url == ("amqp://guest:guest@localhost:5672/",)
    assert settings.prefetch > 0
    assert settings.retry_delays == (1, 5, 30, 120)


def test_environment_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Contract names without prefix, the rest with EXPIRY_; lists are comma-separated."""
    monkeypatch.setenv("DATABASE_URL", "postgresql://u:p@db:5433/x")
    monkeypatch.setenv("AMQP_URL", "amqp://a:b@n1:5672/v, amqp://a:b@n2:5672/v")
    monkeypatch.setenv("EXPIRY_PREFETCH", "7")
    monkeypatch.setenv("EXPIRY_RETRY_DELAYS", "2,4,8")
    settings = load_settings()
    assert settings.database_url == "postgresql://u:p@db:5433/x"
    assert settings.amqp_url == ("amqp://a:b@n1:5672/v", "amqp://a:b@n2:5672/v")
    assert (settings.prefetch, settings.retry_delays) == (7, (2, 4, 8))


def test_dotenv_file_is_read(tmp_path: Path) -> None:
    """A .env file in the working directory (the test's tmp_path) works too."""
    (tmp_path / ".env").write_text("EXPIRY_PREFETCH=3\nAMQP_URL=amqp://x:y@h/\n")
    settings = load_settings()
    assert (settings.prefetch, settings.amqp_url) == (3, ("amqp://x:y@h/",))


JITTER_RANGE = "EXPIRY_RETRY_JITTER: must be a fraction >= 0 and < 1"
SLOTS_RANGE = "EXPIRY_RETRY_JITTER_SLOTS: must be a whole number from 2 to 32"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("EXPIRY_PREFETCH", "-1", "EXPIRY_PREFETCH: Input should be greater than 0"),
        ("EXPIRY_PREFETCH", "lots", "EXPIRY_PREFETCH: Input should be a valid integer"),
        ("DATABASE_URL", "mysql://x@y/z", "DATABASE_URL: must start with postgresql:// or"),
        ("DATABASE_URL", "postgresql://h:notaport/db", "DATABASE_URL: not a valid URL"),
        ("AMQP_URL", "http://broker", "AMQP_URL: must start with amqp:// or amqps://"),
        ("AMQP_URL", " , ", "AMQP_URL: must name at least one"),
        ("EXPIRY_RETRY_DELAYS", "5,1", "EXPIRY_RETRY_DELAYS: must be strictly increasing"),
        ("EXPIRY_RETRY_DELAYS", "1,-5", "EXPIRY_RETRY_DELAYS: Input should be greater than 0"),
        ("EXPIRY_RETRY_JITTER", "1", JITTER_RANGE),
        ("EXPIRY_RETRY_JITTER", "1.5", JITTER_RANGE),
        ("EXPIRY_RETRY_JITTER", "-0.1", JITTER_RANGE),
        ("EXPIRY_RETRY_JITTER", "nan", JITTER_RANGE),
        ("EXPIRY_RETRY_JITTER", "inf", JITTER_RANGE),
        ("EXPIRY_RETRY_JITTER", "half", "EXPIRY_RETRY_JITTER: Input should be a valid number"),
        ("EXPIRY_RETRY_JITTER_SLOTS", "1", SLOTS_RANGE),
        ("EXPIRY_RETRY_JITTER_SLOTS", "0", SLOTS_RANGE),
        ("EXPIRY_RETRY_JITTER_SLOTS", "33", SLOTS_RANGE),
        ("EXPIRY_RETRY_JITTER_SLOTS", "2.5", "EXPIRY_RETRY_JITTER_SLOTS: Input should be a valid"),
        ("EXPIRY_RETRY_JITTER_SLOTS", "many", "EXPIRY_RETRY_JITTER_SLOTS: Input should be a valid"),
        ("EXPIRY_LOG_LEVEL", "LOUD", "EXPIRY_LOG_LEVEL: Input should be"),
        ("EXPIRY_EVENT_LOOP", "trio", "EXPIRY_EVENT_LOOP: Input should be"),
        ("EXPIRY_MANAGEMENT_URL", "ftp://x", "EXPIRY_MANAGEMENT_URL: must be an http://"),
        ("RABBITMQ_MANAGEMENT_URL", "", "RABBITMQ_MANAGEMENT_URL: must be an http://"),
        ("OTEL_TRACES_SAMPLER", "jaeger_remote", "OTEL_TRACES_SAMPLER: Input should be"),
        ("OTEL_TRACES_SAMPLER_ARG", "1.5", "OTEL_TRACES_SAMPLER_ARG: Input should be less"),
        # Less than a week would drop the week being written.
        ("EXPIRY_RETENTION_DAYS", "6", "EXPIRY_RETENTION_DAYS: Input should be greater than"),
        ("EXPIRY_RETENTION_DAYS", "forever", "EXPIRY_RETENTION_DAYS: Input should be a valid"),
        ("EXPIRY_RETENTION_AHEAD_DAYS", "7", "EXPIRY_RETENTION_AHEAD_DAYS: Input should be"),
        ("EXPIRY_RETENTION_WORKING_DAYS", "0", "EXPIRY_RETENTION_WORKING_DAYS: Input should be"),
    ],
)
def test_bad_values_name_the_setting(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    """A bad value becomes one ConfigError line that starts with the setting's name."""
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_a_setting_read_under_two_names_is_named_as_it_was_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """EXPIRY_MANAGEMENT_URL wins over RABBITMQ_MANAGEMENT_URL, and a bad one is named."""
    monkeypatch.setenv("RABBITMQ_MANAGEMENT_URL", "http://fallback:15672")
    assert load_settings().management_url == "http://fallback:15672"
    monkeypatch.setenv("EXPIRY_MANAGEMENT_URL", "http://own:15672")
    assert load_settings().management_url == "http://own:15672"
    monkeypatch.setenv("EXPIRY_MANAGEMENT_URL", "nonsense")
    with pytest.raises(ConfigError, match=r"^EXPIRY_MANAGEMENT_URL: "):
        load_settings()


def test_config_error_never_shows_a_password(monkeypatch: pytest.MonkeyPatch) -> None:
    """The value of a bad URL is not echoed (it may carry a password)."""
    monkeypatch.setenv("AMQP_URL", "amqp://user:s3cret@host:notaport/")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        ("amqp://guest:guest@localhost:5672/", "amqp://guest:***@localhost:5672/"),
        ("postgresql://postgres@localhost/db", "postgresql://postgres@localhost/db"),
        ("postgresql://u:p%40ss@h:5432/d?x=1", "postgresql://u:***@h:5432/d?x=1"),
    ],
)
def test_redact_url(url: str, redacted: str) -> None:
    """Passwords in URLs are replaced; the rest is kept for diagnosis."""
    assert redact_url(url) == redacted


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("EXPIRY_PREFECH", "EXPIRY_PREFECH: unknown setting (did you mean EXPIRY_PREFETCH?)"),
        ("expiry_prefech", "expiry_prefech: unknown setting (did you mean EXPIRY_PREFETCH?)"),
        (
            "EXPIRY_DATABASE_URL",
            "EXPIRY_DATABASE_URL: unknown setting (did you mean DATABASE_URL?)",
        ),
        (
            "EXPIRY_OTEL_ENDPOINT",
            "EXPIRY_OTEL_ENDPOINT: unknown setting (did you mean OTEL_EXPORTER_OTLP_ENDPOINT?)",
        ),
        ("EXPIRY_ZZZ", "EXPIRY_ZZZ: unknown setting"),
    ],
)
def test_an_unknown_expiry_variable_is_refused(
    monkeypatch: pytest.MonkeyPatch, name: str, message: str
) -> None:
    """A typo in an EXPIRY_* name stops the command with one line naming it and a hint."""
    monkeypatch.setenv(name, "1")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert str(caught.value) == message


def test_an_unknown_expiry_variable_in_dotenv_is_refused(tmp_path: Path) -> None:
    """The .env file is checked too; other names there are left alone."""
    (tmp_path / ".env").write_text("RABBITMQ_MANAGEMENT_URL=http://h\nEXPIRY_BATCH_SIZ=3\n")
    with pytest.raises(ConfigError, match=r"^EXPIRY_BATCH_SIZ: unknown setting \(did you mean"):
        load_settings()


def test_every_setting_name_is_known(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each documented EXPIRY_* name (any case) is accepted."""
    monkeypatch.setenv("EXPIRY_LOCK_TIMEOUT_MS", "100")
    monkeypatch.setenv("expiry_log_format", "text")
    monkeypatch.setenv("EXPIRY_FAILPOINT", "")
    settings = load_settings()
    assert (settings.lock_timeout_ms, settings.log_format) == (100, "text")


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u@127.0.0.1:1,127.0.0.1:5432/db?target_session_attrs=read-write",
        "postgresql://u@[::1]:5432/db",
        "postgresql:///postgres?host=/var/run/postgresql&user=postgres",
        "postgresql://%2Fvar%2Frun%2Fpostgresql/db",
        "postgresql:///db",
        "postgresql://user@/db",
        "postgresql:///db?host=h1,h2&port=5432,5433&sslmode=prefer",
    ],
)
def test_every_database_url_form_asyncpg_accepts_is_accepted(
    monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    """Several hosts, IPv6, hosts in the query, socket directories and no host at all."""
    monkeypatch.setenv("DATABASE_URL", url)
    assert load_settings().database_url == url


PASSWORD = "p@ss:w/rd%#?"
FRAGMENTS = ("Xq7", "Zk9", "appuser", "svcuser", "dbhost", "mqhost")


@pytest.mark.parametrize(
    ("name", "url"),
    [
        ("DATABASE_URL", "postgresql://appuser:Xq7@Zk9:w/r%#?@dbhost:5432/Xq7"),
        ("DATABASE_URL", "postgresql://appuser:Xq7/Zk9@dbhost:5432/app"),
        ("DATABASE_URL", "postgresql://appuser:12/Zk9@dbhost/app"),
        ("DATABASE_URL", "postgresql://appuser:Xq7@Zk9@dbhost/app"),
        ("DATABASE_URL", "postgresql://appuser:Xq7@dbhost/app?target_session_attrs=Zk9"),
        ("DATABASE_URL", "postgresql://appuser:Xq7@dbhost:Zk9/app"),
        ("AMQP_URL", "amqp://svcuser:Xq7@Zk9:w/r%#?@mqhost:5672/"),
        ("AMQP_URL", "amqp://svcuser:Xq7/Zk9@mqhost:5672/"),
        ("AMQP_URL", "amqp://svcuser:12/Zk9@mqhost:5672/"),
        ("AMQP_URL", "amqp://svcuser:Xq7#Zk9@mqhost/"),
        ("AMQP_URL", "http://svcuser:Xq7@mqhost/"),
    ],
)
def test_a_bad_url_is_described_never_quoted(
    monkeypatch: pytest.MonkeyPatch, name: str, url: str
) -> None:
    """A URL refused for any reason is named and explained; no part of it is echoed."""
    monkeypatch.setenv(name, url)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = str(caught.value)
    assert message.startswith(f"{name}: ")
    assert "\n" not in message
    for fragment in FRAGMENTS:
        assert fragment not in message


def test_loaded_passwords_are_redacted_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the settings are read, their passwords leave no text, in any form."""
    monkeypatch.setenv("DATABASE_URL", f"postgresql://app:{quote(PASSWORD, safe='')}@db/app")
    monkeypatch.setenv("AMQP_URL", "amqp://svc:hunter2@n1/,amqp://svc:hunter2@n2/")
    load_settings()
    text = redact(f"auth failed: {PASSWORD} / {quote(PASSWORD, safe='')} / hunter2")
    assert text == "auth failed: *** / *** / ***"
