"""Each way a TLS handshake fails, made for real against a server on the loopback (the
machine's OpenSSL, trustme's certificates), is said in words an operator can act on
(``service.core.tls_failures``), also when a library wraps it; anything else is not TLS."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from urllib.error import URLError

import aiormq.exceptions
import pytest

from service.core.tls_failures import tls_failure
from tests.tls.certs import MISMATCHED_HOST, SERVER_HOST, Certs, Pair, make_certs
from tests.tls.refusals import EXPIRED, MISMATCH, PLAIN, UNTRUSTED, WANTED
from tests.tls.servers import handshake_server, server_context


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def _client_context(ca: Path, client: Pair | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        context.load_cert_chain(client.cert, client.key)
    return context


async def _failure(port: int, context: ssl.SSLContext, host: str = SERVER_HOST) -> BaseException:
    """What connecting (and reading: TLS 1.3 tells a refused client certificate then)
    raised."""
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=context, server_hostname=host
        )
        try:
            await asyncio.wait_for(reader.read(100), 5)
        finally:
            writer.close()
    except Exception as exc:  # what the libraries' connects see
        return exc
    raise AssertionError("the handshake succeeded")


async def test_a_server_certificate_from_another_ca_is_said_untrusted(certs: Certs) -> None:
    with handshake_server(server_context(certs.server)) as port:
        exc = await _failure(port, _client_context(certs.wrong_ca))
    assert tls_failure(exc) == UNTRUSTED


async def test_a_certificate_for_another_host_is_said_so(certs: Certs) -> None:
    with handshake_server(server_context(certs.server)) as port:
        exc = await _failure(port, _client_context(certs.ca), host=MISMATCHED_HOST)
    assert tls_failure(exc) == MISMATCH


async def test_an_expired_certificate_is_said_expired(certs: Certs) -> None:
    with handshake_server(server_context(certs.expired_server)) as port:
        exc = await _failure(port, _client_context(certs.ca))
    assert tls_failure(exc) == EXPIRED


async def test_a_plain_server_where_tls_was_asked_for_is_said_plain(certs: Certs) -> None:
    with handshake_server(None) as port:
        exc = await _failure(port, _client_context(certs.ca))
    assert tls_failure(exc) == PLAIN


async def test_a_server_that_wants_a_client_certificate_says_so(certs: Certs) -> None:
    with handshake_server(server_context(certs.server, client_ca=certs.ca)) as port:
        exc = await _failure(port, _client_context(certs.ca))
    assert tls_failure(exc) == WANTED


async def test_a_client_certificate_the_server_does_not_trust_is_said_refused(
    certs: Certs, tmp_path: Path
) -> None:
    strangers = make_certs(tmp_path / "strangers")  # the same names, another CA
    with handshake_server(server_context(certs.server, client_ca=certs.ca)) as port:
        exc = await _failure(port, _client_context(certs.ca, strangers.external_client))
    assert tls_failure(exc) == "the server refused the client certificate (tlsv1_alert_unknown_ca)"


async def test_the_cause_is_found_inside_what_aiormq_and_urllib_raise(certs: Certs) -> None:
    with handshake_server(server_context(certs.expired_server)) as port:
        exc = await _failure(port, _client_context(certs.ca))
    wrapped = aiormq.exceptions.AMQPConnectionError(*exc.args)
    wrapped.__cause__ = exc  # as aiormq raises it: "from e"
    assert tls_failure(wrapped) == EXPIRED
    assert tls_failure(URLError(exc)) == EXPIRED


async def test_a_failure_that_is_not_tls_is_none(certs: Certs) -> None:
    with handshake_server(None) as port:
        pass  # closed: nothing listens there any more
    with pytest.raises(ConnectionRefusedError) as refused:
        await asyncio.open_connection("127.0.0.1", port, ssl=_client_context(certs.ca))
    assert tls_failure(refused.value) is None
    assert tls_failure(ConnectionResetError()) is None
    assert tls_failure(None) is None
