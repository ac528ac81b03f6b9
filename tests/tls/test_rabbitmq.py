"""The service over amqps:// to a node that asks for a client certificate, with its
management API over https (also asking for one): it declares, scans and expires, logging in
with a password or with the certificate (EXTERNAL); and every TLS failure stops a command
at start with one line naming the setting, no traceback and no password."""

from __future__ import annotations

import asyncio
import logging
import uuid
from functools import partial

import pytest

from service import scan
from service.adapters.amqp.management import Management
from service.declare import declare
from service.settings import Settings
from tests import support
from tests.acceptance.processes import base_env
from tests.tls.certs import EXTERNAL_USER, MISMATCHED_HOST, Certs
from tests.tls.refusals import EXPIRED, MISMATCH, PLAIN, UNTRUSTED, WANTED, refusal
from tests.tls.servers import TlsRabbitNode, client_options, handshake_server, server_context

pytestmark = [pytest.mark.integration, pytest.mark.private_broker]


@pytest.fixture
async def vhost(tls_broker: TlsRabbitNode) -> str:
    """A fresh vhost on the TLS node, guest and the certificate's user allowed in it."""
    name = f"tls-{uuid.uuid4().hex[:8]}"
    await Management(tls_broker.management_url).create_vhost(name)
    allowed = (".*", ".*", ".*")
    await asyncio.to_thread(tls_broker.ctl, "set_permissions", "-p", name, EXTERNAL_USER, *allowed)
    return name


@pytest.fixture(scope="session", autouse=True)
def _external_user(tls_broker: TlsRabbitNode) -> None:
    """The user a client certificate logs in as (its common name), with no password."""
    tls_broker.ctl("add_user", EXTERNAL_USER, uuid.uuid4().hex)
    tls_broker.ctl("clear_password", EXTERNAL_USER)


def _on_node(stack: support.Stack, url: str, node: TlsRabbitNode) -> Settings:
    return stack.settings.model_copy(update={"amqp_url": (url,), "management_url": node.https_url})


def _said(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.msg == event]


async def test_the_service_runs_over_amqps_with_a_password_and_with_a_certificate(
    stack: support.Stack,
    tls_broker: TlsRabbitNode,
    tls_certs: Certs,
    vhost: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """declare, a scan pass and a consumer over amqps:// (guest's password, then EXTERNAL
    with the client certificate's common name); the topology's arguments read over the
    https API, with the client certificate it asks for."""
    caplog.set_level(logging.INFO)
    options = client_options(tls_certs)
    with_password = _on_node(stack, tls_broker.amqps_url(vhost, options=options), tls_broker)
    with_certificate = _on_node(
        stack,
        tls_broker.amqps_url(vhost, user=None, options={**options, "auth": "external"}),
        tls_broker,
    )
    await declare(with_password)
    expired = 0
    for settings, user in ((with_password, "guest"), (with_certificate, EXTERNAL_USER)):
        ids = await support.insert_holds(stack.database_url, 20)
        expired += len(ids)
        assert (await scan.scan_once(settings)).published == len(ids)
        async with support.running_consumer(settings):
            await support.eventually(partial(_expired, stack, expired))
            await support.eventually(partial(_connected_over_tls, tls_broker, vhost, user))
    assert _said(caplog, "topology.arguments_unchecked") == []  # the https API was read


async def _connected_over_tls(node: TlsRabbitNode, vhost: str, user: str) -> bool:
    """Whether ``user`` has a connection to ``vhost``, and every connection there is TLS."""
    found = await Management(node.management_url).request(
        "GET", f"/vhosts/{vhost}/connections", columns="user,ssl"
    )
    return any(c["user"] == user for c in found) and all(c["ssl"] for c in found)


async def _expired(stack: support.Stack, count: int) -> bool:
    return (await support.statuses(stack.database_url)).get("expired", 0) >= count


@pytest.mark.parametrize(
    "case", ["wrong-ca", "host-mismatch", "no-client-certificate", "expired", "plain-server"]
)
async def test_each_tls_failure_to_the_broker_stops_a_command_with_one_line(
    tls_broker: TlsRabbitNode, tls_certs: Certs, vhost: str, case: str
) -> None:
    options = client_options(tls_certs)
    host, port = "localhost", tls_broker.tls_port
    expected = UNTRUSTED
    if case == "wrong-ca":
        options["cafile"] = tls_certs.wrong_ca
    elif case == "host-mismatch":
        host = MISMATCHED_HOST
        expected = MISMATCH
    elif case == "no-client-certificate":
        options = {"cafile": tls_certs.ca}
        expected = WANTED
    elif case == "plain-server":
        port = 5672  # the machine's broker, without TLS
        expected = PLAIN
    with handshake_server(server_context(tls_certs.expired_server)) as expired_port:
        if case == "expired":
            port, expected = expired_port, EXPIRED
        url = tls_broker.amqps_url(vhost, host=host, port=port, options=options)
        line = await asyncio.to_thread(refusal, "service.declare", {"AMQP_URL": url})
    assert line.endswith(
        f": configuration error: AMQP_URL: TLS to RabbitMQ at {host}:{port} refused: {expected}"
    )


async def test_the_management_api_refused_for_its_tls_stops_a_consumer_with_one_line(
    stack: support.Stack, tls_broker: TlsRabbitNode, tls_certs: Certs, vhost: str
) -> None:
    """The broker is right, the https API's certificate is not signed by the CA given for
    it: the consumer stops at start naming EXPIRY_MANAGEMENT_URL."""
    env = {
        "DATABASE_URL": stack.database_url,
        "AMQP_URL": tls_broker.amqps_url(vhost, options=client_options(tls_certs)),
        "EXPIRY_MANAGEMENT_URL": tls_broker.https_url,
        "EXPIRY_HTTP_PORT": "0",
    }
    declared = await asyncio.to_thread(
        support.run_module, "service.declare", env=base_env() | env, timeout=90
    )
    assert declared.returncode == 0, declared.stderr[-2000:]  # with the right CA
    env["EXPIRY_MANAGEMENT_CA_FILE"] = str(tls_certs.wrong_ca)
    line = await asyncio.to_thread(refusal, "service.consume", env)
    base = f"https://localhost:{tls_broker.https_port}"
    assert line.endswith(
        f": configuration error: EXPIRY_MANAGEMENT_URL: TLS to {base} refused: {UNTRUSTED}"
    )


async def test_without_a_ca_file_the_systems_cas_check_the_broker_and_its_api(
    stack: support.Stack, tls_broker: TlsRabbitNode, tls_certs: Certs, vhost: str
) -> None:
    """No cafile, no EXPIRY_MANAGEMENT_CA_FILE: the system's CAs decide (OpenSSL's
    SSL_CERT_FILE stands for a system store holding the CA): declare, then a scan pass
    that reads the topology's arguments over https; without the CA in the store, refused
    as untrusted."""
    client = tls_certs.external_client
    env = {
        "DATABASE_URL": stack.database_url,
        "AMQP_URL": tls_broker.amqps_url(
            vhost, options={"certfile": client.cert, "keyfile": client.key}
        ),
        "EXPIRY_MANAGEMENT_URL": tls_broker.https_url,
        "SSL_CERT_FILE": str(tls_certs.ca),
    }
    declared = await asyncio.to_thread(
        support.run_module, "service.declare", env=base_env() | env, timeout=90
    )
    assert declared.returncode == 0, declared.stderr[-2000:]
    scanned = await asyncio.to_thread(
        support.run_module, "service.produce", "--scan", env=base_env() | env, timeout=90
    )
    assert scanned.returncode == 0, scanned.stderr[-2000:]
    assert "arguments_unchecked" not in scanned.stderr  # the https API was read
    env["SSL_CERT_FILE"] = str(tls_certs.wrong_ca)
    line = await asyncio.to_thread(refusal, "service.declare", env)
    where = f"RabbitMQ at localhost:{tls_broker.tls_port}"
    assert line.endswith(f": configuration error: AMQP_URL: TLS to {where} refused: {UNTRUSTED}")
