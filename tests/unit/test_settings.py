"""Unit tests for service.settings: defaults, one-line errors, redaction."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.errors import ConfigError
from service.settings import load_settings, redact_url


@pytest.fixture(autouse=True)
def _no_service_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CI's DATABASE_URL and AMQP_URL must not change what defaults look like."""
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("AMQP_URL", raising=False)


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
        ("EXPIRY_LOG_LEVEL", "LOUD", "EXPIRY_LOG_LEVEL: Input should be"),
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
