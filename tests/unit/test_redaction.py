"""Unit tests for service.core.redaction: no password survives, whatever characters it holds."""

from __future__ import annotations

import json
import re
import string
from collections.abc import Iterator
from urllib.parse import quote

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from service.core.redaction import (
    MASK,
    forget_secrets,
    might_hold_secret,
    redact,
    register_secrets,
    register_url_secrets,
    url_passwords,
)


@pytest.fixture(autouse=True)
def _no_known_secrets() -> Iterator[None]:
    """Each test starts and ends with no registered secret."""
    forget_secrets()
    yield
    forget_secrets()


@pytest.mark.parametrize(
    ("text", "redacted"),
    [
        ("amqp://guest:guest@localhost:5672/", "amqp://guest:***@localhost:5672/"),
        ("amqp://u:p@ss@host/", "amqp://u:***@host/"),
        ("amqp://u:p%40ss@host/", "amqp://u:***@host/"),
        ("amqp://u:pa:ss@host/", "amqp://u:***@host/"),
        ("amqp://u:pa/ss?x#y%z@host:5672/v", "amqp://u:***@host:5672/v"),
        ("amqp://u:p@h1/,amqp://u:q@h2/", "amqp://u:***@h1/,amqp://u:***@h2/"),
        ("amqp://h1:5672/,amqp://u:q@h2/", "amqp://h1:5672/,amqp://u:***@h2/"),
        ("postgresql://a:b@h/db and amqp://c:d@e/", "postgresql://a:***@h/db and amqp://c:***@e/"),
        ("postgresql://u:p%2F@h1:1,h2:2/db", "postgresql://u:***@h1:1,h2:2/db"),
        ("x='amqp://u:p@h/' y=\"amqp://v:q@i/\"", "x='amqp://u:***@h/' y=\"amqp://v:***@i/\""),
        ("ConnectionError('amqp://u:p@ss@h/')", "ConnectionError('amqp://u:***@h/')"),
        (
            "postgresql:///db?host=/tmp&password=pw&x=1",
            "postgresql:///db?host=/tmp&password=***&x=1",
        ),
        ("host=h Password=s3 sslpassword=k", "host=h Password=*** sslpassword=***"),
        ("amqp://:pw@h/", "amqp://:***@h/"),
        (
            "postgresql://postgres@localhost:5432/postgres",
            "postgresql://postgres@localhost:5432/postgres",
        ),
        (
            "postgresql:///postgres?host=/var/run/postgresql",
            "postgresql:///postgres?host=/var/run/postgresql",
        ),
        ("http://host:8080/path and a@b", "http://host:8080/path and a@b"),
        ("no url here", "no url here"),
    ],
)
def test_url_rule(text: str, redacted: str) -> None:
    """URL passwords go up to the last @ of the URL; hosts and everything else stay."""
    assert redact(text) == redacted


def test_known_secrets_go_everywhere_in_every_form() -> None:
    """A registered password is removed raw, percent-decoded, encoded and escaped."""
    register_url_secrets("postgresql://app:pa%2Fss%40word@db/app")
    for text in ("pa/ss@word", "pa%2Fss%40word", "pa%2fss%40word", json.dumps("pa/ss@word")):
        assert "ss" not in redact(f"error: {text}!").replace("***", "")
    assert redact("app connected") == "app connected"


def test_short_passwords_and_user_names_are_left_to_the_url_rule() -> None:
    """A password under 4 characters, or equal to its user, is not removed everywhere."""
    register_url_secrets("amqp://guest:guest@h/,amqp://svc:abc@h2/")
    assert redact("guest logged in; abc") == "guest logged in; abc"
    assert redact("amqp://guest:guest@h/") == "amqp://guest:***@h/"


def test_url_passwords_reads_every_parser_s_view() -> None:
    """The last-@ reading, the first-@ reading, urlsplit's and query passwords are found."""
    found = url_passwords("postgresql://u:p%40ss@word@h/db?password=querypw,amqp://v:nodeb@h2/")
    assert {"p%40ss@word", "p%40ss", "querypw", "nodeb"} <= found


def test_secrets_are_found_in_json_lines() -> None:
    """The pre-check sees a known secret in the JSON encoding of a text, escapes and all."""
    secret = 'q"uo\\te€pw'
    register_secrets([secret])
    line = json.dumps({"event": f"x {secret} y"})
    assert might_hold_secret(line)
    assert not might_hold_secret(json.dumps({"event": "expiry.outcome", "outcome": "expired"}))


USERS = st.text(string.ascii_letters + string.digits + "-_.", min_size=1, max_size=12)
HOSTS = st.from_regex(r"[a-z][a-z0-9-]{0,10}(\.[a-z]{2,5})?(:[0-9]{1,5})?", fullmatch=True)
PASSWORDS = st.text(
    st.sampled_from(string.printable.strip() + "@:/%#?" * 5), min_size=1, max_size=24
)
SCHEMES = st.sampled_from(["amqp", "amqps", "postgresql", "postgres"])
# A raw password can't be told from its surroundings when it holds one of these:
# left to the literal rule (a registered secret).
NOT_RAW = re.compile(r"""[\s'"<>`]|[,;][A-Za-z][A-Za-z0-9+.-]*://""")


def _assert_gone(text: str, expected: str, password: str) -> None:
    result = redact(text)
    assert result == expected
    # Outside the mask, a password may only show where the rest of the URL holds it anyway.
    rest = expected.replace(MASK, "\0")
    for form in (password, quote(password, safe="")):
        assert form not in result.replace(MASK, "\0") or form in rest


@given(SCHEMES, USERS, PASSWORDS, HOSTS)
def test_encoded_passwords_never_survive(scheme: str, user: str, password: str, host: str) -> None:
    """A percent-encoded password of any characters goes, alone or within a sentence."""
    url = f"{scheme}://{user}:{quote(password, safe='')}@{host}/v"
    expected = f"{scheme}://{user}:***@{host}/v"
    _assert_gone(url, expected, password)
    _assert_gone(f"cannot reach {url}: refused", f"cannot reach {expected}: refused", password)


@given(SCHEMES, USERS, PASSWORDS, HOSTS)
def test_raw_passwords_never_survive(scheme: str, user: str, password: str, host: str) -> None:
    """A raw password holding @ : / % # ? goes whole too; a list keeps every host."""
    assume(NOT_RAW.search(password) is None)
    url = f"{scheme}://{user}:{password}@{host}/v"
    expected = f"{scheme}://{user}:***@{host}/v"
    _assert_gone(url, expected, password)
    _assert_gone(f"{url},{url}", f"{expected},{expected}", password)
    _assert_gone(f"['{url}'] failed", f"['{expected}'] failed", password)


@given(USERS, st.text(min_size=4, max_size=24).filter(lambda p: "*" not in p))
def test_registered_secrets_never_survive(user: str, password: str) -> None:
    """Once registered, a password of any characters is gone from any text, in any form."""
    assume(password != user)
    forget_secrets()  # each example on its own (the fixture runs once per test)
    register_url_secrets(f"amqp://{user}:{quote(password, safe='')}@h/")
    for form in (password, quote(password, safe=""), json.dumps(password)[1:-1]):
        assert form not in redact(f"x {form} y {form}{form}")
    for form in (password, quote(password, safe="")):  # as a JSON log line holds them
        assert might_hold_secret(json.dumps({"event": f"x {form} y"}))
