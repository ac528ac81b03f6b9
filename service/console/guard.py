"""What every request meets before the console reads it, and every answer carries.

``Guard`` wraps the whole application (outside Starlette's own error handling, so a 500
carries them too) and:

- adds ``SECURITY_HEADERS`` to every answer;
- refuses, with a plain 400 page, a path or a query string whose percent-decoded bytes
  are not UTF-8 or hold a control character (NUL among them: PostgreSQL refuses it in
  text), a value over ``VALUE_LIMIT`` characters, or more than ``FIELD_LIMIT`` fields;
- refuses a POST body larger than ``MAX_BODY_BYTES`` (or of unknown length) with 413 and
  one that is not a URL-encoded form with 415, then checks the form's fields as it
  checks a query string (``plan``, a confirmation's list, may be ``PLAN_LIMIT`` long),
  before anything parses it.

The request line and the headers are limited by the HTTP server
(``service/console/protocol.py``: 414 and 431).
"""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

from starlette.types import ASGIApp, Message, Receive, Scope, Send

SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}
MAX_BODY_BYTES = 64 * 1024
PATH_LIMIT = 1024
VALUE_LIMIT = 4096
PLAN_LIMIT = 40 * 1024  # a confirm form's plan: up to 1,000 ``id:revision`` pairs
FIELD_LIMIT = 50
FORM_TYPE = b"application/x-www-form-urlencoded"

PLAIN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title} · expiry console</title>
<link rel="stylesheet" href="/static/console.css"></head>
<body><header><strong>expiry console</strong></header><main>
<h1>{title}</h1><p class="bad" id="refused">{why}</p><p><a href="/">back to the overview</a></p>
</main></body></html>
"""


def plain_page(status: int, title: str, why: str) -> tuple[int, bytes]:
    """A page that says what went wrong and nothing else (``title`` and ``why`` are
    ours, never the request's)."""
    return status, PLAIN_PAGE.format(title=title, why=why).encode()


class Refused(ValueError):
    """A request the console answers with ``status`` before reading it."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


def check_text(raw: bytes, limit: int, what: str, allowed: str = "") -> None:
    """Refuse percent-decoded ``raw`` that is not UTF-8, holds a control character (but
    those ``allowed``), or is longer than ``limit`` characters."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Refused(400, f"{what} is not valid UTF-8") from None
    if len(text) > limit:
        raise Refused(400, f"{what} is too long")
    if any((ord(char) < 32 or ord(char) == 127) and char not in allowed for char in text):
        raise Refused(400, f"{what} holds a control character")


def check_fields(encoded: bytes, what: str) -> None:
    """Check each name and value of a query string or a URL-encoded form (a form's
    values may hold tabs and line breaks: a pasted note)."""
    pairs = [pair for pair in encoded.split(b"&") if pair]
    if len(pairs) > FIELD_LIMIT:
        raise Refused(400, f"the {what} has too many fields")
    for pair in pairs:
        name, _, value = pair.partition(b"=")
        name_text = unquote_to_bytes(name.replace(b"+", b" "))
        check_text(name_text, 100, f"a {what} field's name")
        limit = PLAN_LIMIT if name_text == b"plan" else VALUE_LIMIT
        allowed = "\t\r\n" if what == "form" else ""
        value_text = unquote_to_bytes(value.replace(b"+", b" "))
        check_text(value_text, limit, f"a {what} value", allowed)


def check_target(scope: Scope) -> None:
    """Check the path and the query string."""
    raw_path = scope.get("raw_path") or scope["path"].encode("utf-8", "surrogateescape")
    path = raw_path.split(b"?", 1)[0]
    if len(path) > PATH_LIMIT:
        raise Refused(414, "the path is too long")
    check_text(unquote_to_bytes(path), PATH_LIMIT, "the path")
    check_fields(scope.get("query_string", b""), "query")


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return bytes(value)
    return None


def check_body_headers(scope: Scope) -> None:
    """A POST says it carries a small URL-encoded form."""
    length = _header(scope, b"content-length")
    if length is None or not length.isdigit() or int(length) > MAX_BODY_BYTES:
        raise Refused(413, "the request is too large")
    kind = (_header(scope, b"content-type") or b"").split(b";", 1)[0].strip().lower()
    if int(length) and kind != FORM_TYPE:
        raise Refused(415, "only forms are taken here")


async def read_body(receive: Receive) -> bytes:
    """The whole body (its length was checked), as the client sent it."""
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Refused(400, "the request ended early")
        body += bytes(message.get("body", b""))
        if len(body) > MAX_BODY_BYTES:
            raise Refused(413, "the request is too large")
        if not message.get("more_body", False):
            return body


class Guard:
    """The console's outermost layer (see the module's docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (k, v)
                    for k, v in message.get("headers", [])
                    if k.decode("latin-1").lower() not in SECURITY_HEADERS
                ]
                headers += [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                message["headers"] = headers
            await send(message)

        try:
            check_target(scope)
            if scope["method"] not in ("GET", "HEAD"):
                check_body_headers(scope)
                body = await read_body(receive)
                check_fields(body, "form")
                receive = _replaying(body, receive)
        except Refused as exc:
            await _answer(with_headers, exc.status, str(exc))
            return
        await self.app(scope, receive, with_headers)


TITLES = {400: "Bad request", 413: "Too large", 414: "Too long", 415: "Not a form"}


async def _answer(send: Send, status: int, why: str) -> None:
    code, body = plain_page(status, TITLES.get(status, "Not done"), why)
    await send(
        {
            "type": "http.response.start",
            "status": code,
            "headers": [
                (b"content-type", b"text/html; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _replaying(body: bytes, then: Receive) -> Receive:
    """A ``receive`` that gives the app the body already read, then what comes next."""
    given = False

    async def receive() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await then()

    return receive
