"""Redaction: no credential leaves the process, whatever characters it holds.

Pure (no I/O). ``redact`` makes two passes over text about to leave the process
(a log line, an error, a status screen, a traceback):

1. the URL rule: in ``scheme://user:password@host`` the password, taken up to
   the *last* ``@`` of the URL, becomes ``***``, so a password holding
   ``@ : / % # ?`` (raw or percent-encoded) goes whole. A URL never spans
   whitespace, a quote, or a ``,`` or ``;`` that starts another URL, so
   ``amqp://u:p@h1/,amqp://u:p@h2/`` keeps both hosts. ``password=`` and
   ``sslpassword=`` values (a URL's query, a libpq keyword string) go too.
2. the literal rule: the secrets this process knows (``register_url_secrets``,
   called when the settings are read) are removed wherever they appear, in
   raw, percent-decoded, percent-encoded and escaped (JSON, ``repr``) forms.
   Secrets shorter than ``MIN_SECRET_LENGTH``, or equal to their user name,
   are left to the URL rule: removing a one-letter password everywhere would
   destroy the logs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from urllib.parse import parse_qsl, quote, unquote, urlsplit

MASK = "***"
MIN_SECRET_LENGTH = 4

_SCHEME = r"[A-Za-z][A-Za-z0-9+.-]*://"
_NOT_IN_URL = r"\s'\"<>`"
_URL_PASSWORD = re.compile(
    rf"(?P<head>{_SCHEME}(?P<user>[^{_NOT_IN_URL}:/]*)):"
    rf"(?P<password>(?:(?![,;]{_SCHEME})[^{_NOT_IN_URL}])+)@"
)
_KEYWORD_PASSWORD = re.compile(r"(?P<key>\b(?:ssl)?[pP]assword=)[^\s&'\"]+")
_PASSWORD_KEYS = frozenset({"password", "sslpassword"})
_ALNUM_RUN = re.compile(r"[A-Za-z0-9]+")
_MIN_NEEDLE_LENGTH = 3


class _Known:
    """The secrets registered so far: every form, one pattern matching any of them,
    and needles, a few substrings one of which each form contains (a quick pre-check)."""

    forms: frozenset[str] = frozenset()
    pattern: re.Pattern[str] | None = None
    needles: tuple[str, ...] = ()


def redact(text: str) -> str:
    """``text`` without URL passwords, ``password=`` values and the known secrets."""
    if "://" in text:
        text = _URL_PASSWORD.sub(rf"\g<head>:{MASK}@", text)
    if "assword=" in text:
        text = _KEYWORD_PASSWORD.sub(rf"\g<key>{MASK}", text)
    if _Known.pattern is not None and _has_needle(text):
        text = _Known.pattern.sub(MASK, text)
    return text


def might_hold_secret(text: str) -> bool:
    """A cheap test: False means ``redact(text)`` would change nothing.

    Also true of the JSON encoding of such text (the escaped forms of the
    known secrets count as forms).
    """
    return "://" in text or "assword=" in text or _has_needle(text)


def _has_needle(text: str) -> bool:
    for needle in _Known.needles:  # noqa: SIM110 (a hot path: a loop costs less than any())
        if needle in text:
            return True
    return False


def redact_url(url: str) -> str:
    """``url`` (or any text holding URLs) with its password replaced by ``***``."""
    return redact(url)


def register_url_secrets(text: str) -> None:
    """Remember the passwords of the URLs in ``text`` (one URL or a comma-separated list)."""
    register_secrets(url_passwords(text))


def register_secrets(secrets: Iterable[str]) -> None:
    """Remember ``secrets``: from now on ``redact`` removes them wherever they appear."""
    forms = {form for secret in secrets for form in _forms(secret)}
    if forms - _Known.forms:
        _Known.forms |= forms
        # Longest first, so that a form is never cut short by one of its prefixes.
        alternatives = sorted(_Known.forms, key=lambda form: (-len(form), form))
        _Known.pattern = re.compile("|".join(re.escape(form) for form in alternatives))
        _Known.needles = _needles(_Known.forms)


def forget_secrets() -> None:
    """Forget every registered secret (for tests)."""
    _Known.forms = frozenset()
    _Known.pattern = None
    _Known.needles = ()


def _needles(forms: Iterable[str]) -> tuple[str, ...]:
    """Few substrings such that each form contains one: the longest run of letters
    and digits of each form (encodings and escapes leave those alone), or the
    form itself; then only those that contain no other."""
    candidates = sorted({_needle(form) for form in forms}, key=len)
    needles: list[str] = []
    for candidate in candidates:
        if not any(needle in candidate for needle in needles):
            needles.append(candidate)
    return tuple(needles)


def _needle(form: str) -> str:
    longest = max(_ALNUM_RUN.findall(form), key=len, default="")
    return longest if len(longest) >= _MIN_NEEDLE_LENGTH else form


def url_passwords(text: str) -> set[str]:
    """The passwords in ``text``'s URLs, read every way a parser might read them.

    The text between ``user:`` and the last ``@`` (this module's reading),
    between ``user:`` and the first ``@`` (asyncpg's, libpq's), what
    ``urlsplit`` makes of it, and ``password=`` query values. Those shorter
    than ``MIN_SECRET_LENGTH`` or equal to their user name are left out.
    """
    found: set[str] = set()
    for match in _URL_PASSWORD.finditer(text):
        user, password = unquote(match["user"]), match["password"]
        candidates = {password, password.partition("@")[0]}
        found |= {raw for raw in candidates if _worth_registering(raw, user)}
    for part in text.split(","):
        found |= set(_parsed_passwords(part.strip()))
    return found


def _parsed_passwords(url: str) -> Iterator[str]:
    try:
        parts = urlsplit(url)
        user, password = parts.username or "", parts.password
        query = parse_qsl(parts.query)
    except ValueError:
        return
    if password and _worth_registering(password, unquote(user)):
        yield password
    for key, value in query:
        if key.lower() in _PASSWORD_KEYS and _worth_registering(value, ""):
            yield value


def _worth_registering(raw: str, user: str) -> bool:
    decoded = unquote(raw)
    return len(decoded) >= MIN_SECRET_LENGTH and decoded != user


def _forms(secret: str) -> set[str]:
    """The ways ``secret`` may be written: raw, decoded, encoded, escaped."""
    decoded = unquote(secret)
    encoded = {quote(decoded, safe=""), quote(decoded), quote(decoded, safe="@:")}
    encoded |= {_lower_hex(form) for form in encoded}
    plain = {secret, decoded, *encoded}
    escaped = {json.dumps(form)[1:-1] for form in plain} | {repr(form)[1:-1] for form in plain}
    return {form for form in plain | escaped if len(form) >= MIN_SECRET_LENGTH}


def _lower_hex(encoded: str) -> str:
    return re.sub(r"%[0-9A-F]{2}", lambda escape: escape[0].lower(), encoded)
