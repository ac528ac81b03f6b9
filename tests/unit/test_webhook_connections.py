"""The webhooks' HTTP connections (``service/adapters/http/connections.py``) as the sender
uses them, against small servers on the loopback: a connection is kept for the next
request, and not when the server closes it, sends more than the body's bound or says
``Connection: close``; an idle connection the server closed is not used again; TLS is
verified (a certificate the trust store does not know: no request), and a request over
it arrives whole.
"""

from __future__ import annotations

import asyncio
import base64
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest

from service.adapters.http.connections import BODY_READ_LIMIT
from service.adapters.http.webhook_sender import Sender
from service.core import webhook_policy
from service.core.webhook_policy import Verdict
from service.settings import Endpoint

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()
OK = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"

Answer = Callable[[bytes], bytes]  # the request's head -> the whole answer


class Server:
    """Answers each request on the loopback; counts connections and requests."""

    def __init__(self, answer: Answer, close_after: bool = False) -> None:
        self.answer, self.close_after = answer, close_after
        self.connections = 0
        self.heads: list[bytes] = []
        self.writers: list[asyncio.StreamWriter] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.lower().split(b"\r\n")
                    if line.startswith(b"content-length:")
                )
                await reader.readexactly(length)
                self.heads.append(head)
                writer.write(self.answer(head))
                await writer.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def serving(server: Server, tls: ssl.SSLContext | None = None) -> AsyncIterator[int]:
    listening = await asyncio.start_server(server.handle, "127.0.0.1", 0, ssl=tls)
    try:
        yield listening.sockets[0].getsockname()[1]
    finally:
        listening.close()
        for writer in server.writers:
            writer.close()


def _sender(url: str) -> Sender:
    endpoint = Endpoint.model_validate(
        {"name": "orders", "url": url, "secret": SECRET, "allow_networks": ["127.0.0.0/8"]}
    )
    return Sender(endpoint, concurrency=2)


async def _posts(sender: Sender, count: int) -> list[webhook_policy.Answer]:
    try:
        return [await sender.post(f"expired:{i}:1", b"{}", datetime.now(UTC)) for i in range(count)]
    finally:
        await sender.close()


async def test_a_connection_serves_request_after_request() -> None:
    server = Server(lambda _head: OK)
    async with serving(server) as port:
        answers = await _posts(_sender(f"http://127.0.0.1:{port}/hook"), 3)
    assert [a.verdict for a in answers] == [Verdict.DELIVERED] * 3
    assert (server.connections, len(server.heads)) == (1, 3)


@pytest.mark.parametrize(
    ("answer", "close_after"),
    [
        (b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n", False),
        (OK, True),  # closed by the server once idle, without a word
        (b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s", False),  # past the body's bound
        (b"HTTP/1.0 200 OK\r\n\r\nread to its end", True),  # no length: read to the end
    ],
)
async def test_a_connection_the_server_ends_or_that_says_too_much_is_not_used_again(
    answer: bytes, close_after: bool
) -> None:
    if b"%d" in answer:
        body = b"x" * (BODY_READ_LIMIT + 1)
        answer = answer % (len(body), body)
    server = Server(lambda _head: answer, close_after=close_after)
    async with serving(server) as port:
        sender = _sender(f"http://127.0.0.1:{port}/hook")
        first = await sender.post("expired:a:1", b"{}", datetime.now(UTC))
        await asyncio.sleep(0.1)  # the server's end reaches the client
        answers = [first, *await _posts(sender, 1)]
    assert [a.status for a in answers] == [200, 200]
    assert server.connections == 2


def _certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A private CA, and a certificate for localhost it issued (and its key), made by
    openssl with the extensions a strict verifier asks for (Python 3.13's default)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make certificates with")
    ca, ca_key = directory / "ca.pem", directory / "ca.key"
    cert, key = directory / "cert.pem", directory / "key.pem"
    new = ("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1")
    ca_extensions = ("basicConstraints=critical,CA:TRUE", "keyUsage=critical,keyCertSign,cRLSign")
    extensions = (
        "subjectAltName=DNS:localhost",
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        "extendedKeyUsage=serverAuth",
    )
    for command in (
        [*new, "-keyout", str(ca_key), "-out", str(ca), "-subj", "/CN=expiry test CA"]
        + [part for extension in ca_extensions for part in ("-addext", extension)],
        [*new, "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost"]
        + ["-CA", str(ca), "-CAkey", str(ca_key)]
        + [part for extension in extensions for part in ("-addext", extension)],
    ):
        subprocess.run(command, check=True, capture_output=True)
    return ca, cert, key


async def test_tls_is_verified_and_carries_the_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca, cert, key = _certificates(tmp_path)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    server = Server(lambda _head: OK)
    async with serving(server, tls) as port:
        url = f"https://localhost:{port}/hook?x=1"
        [refused] = await _posts(_sender(url), 1)  # a certificate nobody trusts here
        monkeypatch.setenv("SSL_CERT_FILE", str(ca))  # the private CA, as an operator would
        answers = await _posts(_sender(url), 2)
    assert (refused.verdict, refused.error_class) == (Verdict.RETRY, webhook_policy.UNREACHABLE)
    assert [a.verdict for a in answers] == [Verdict.DELIVERED] * 2
    assert (server.connections, len(server.heads)) == (1, 2)  # the refused one never got in
    assert server.heads[0].startswith(b"POST /hook?x=1 HTTP/1.1\r\n")
    assert f"host: localhost:{port}\r\n".encode() in server.heads[0].lower()
