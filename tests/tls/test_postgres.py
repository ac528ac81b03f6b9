"""The service over sslmode=verify-full to a cluster that takes TLS alone, with a client
certificate as the login: it migrates, scans and expires; and every TLS failure (a wrong
CA, a host name mismatch, no client certificate, an expired certificate, a plain server)
stops a command at start with one line naming DATABASE_URL, no traceback; the relay's
LISTEN URL behind a transaction pooler, EXPIRY_DB_SESSION_URL, is named as itself."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import asyncpg
import pytest

from service import scan
from service.adapters.postgres.schema import migrate
from tests import support
from tests.faults.nodes import PgCluster
from tests.tls.certs import MISMATCHED_HOST, Certs
from tests.tls.refusals import EXPIRED, MISMATCH, PLAIN, UNTRUSTED, WANTED, refusal
from tests.tls.servers import postgres_url

pytestmark = [pytest.mark.integration, pytest.mark.private_broker]


async def _database(cluster: PgCluster, certs: Certs) -> str:
    """A new database on the cluster (made over TLS too), its verify-full URL."""
    name = f"expiry_tls_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(postgres_url(cluster, certs))
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return postgres_url(cluster, certs, database=name)


async def test_the_service_runs_over_verify_full_with_a_client_certificate(
    stack: support.Stack, tls_postgres: PgCluster, tls_certs: Certs
) -> None:
    """migrate, a scan pass and a consumer, every connection TLS with the certificate's
    login (the cluster takes nothing else: pg_stat_ssl says so for the test's own)."""
    url = await _database(tls_postgres, tls_certs)
    settings = stack.settings.model_copy(update={"database_url": url})
    await migrate(settings)
    ids = await support.insert_holds(url, 30)
    assert (await scan.scan_once(settings)).published == len(ids)
    async with support.running_consumer(settings):
        await support.eventually(partial(_expired, url, len(ids)))
    async with support.pg_connection(url) as conn:
        row = await conn.fetchrow(
            "SELECT ssl, client_dn FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
        )
    assert row is not None
    assert row["ssl"]
    assert row["client_dn"].endswith("/CN=postgres")


async def _expired(url: str, count: int) -> bool:
    return (await support.statuses(url)).get("expired", 0) == count


def _refusal(url: str) -> str:
    return refusal("service.migrate", {"DATABASE_URL": url})


def _expected(cluster: PgCluster, why: str, host: str = "localhost") -> str:
    where = f"PostgreSQL at {host}:{cluster.port}"
    return f": configuration error: DATABASE_URL: TLS to {where} refused: {why}"


@pytest.mark.parametrize("case", ["wrong-ca", "host-mismatch", "no-client-certificate"])
async def test_each_tls_failure_to_the_database_stops_a_command_with_one_line(
    tls_postgres: PgCluster, tls_certs: Certs, case: str
) -> None:
    if case == "wrong-ca":
        url = postgres_url(tls_postgres, tls_certs, root=tls_certs.wrong_ca)
        expected = _expected(tls_postgres, UNTRUSTED)
    elif case == "host-mismatch":
        url = postgres_url(tls_postgres, tls_certs, host=MISMATCHED_HOST)
        expected = _expected(
            tls_postgres,
            MISMATCH,
            host=MISMATCHED_HOST,
        )
    else:
        url = postgres_url(tls_postgres, tls_certs).split("&sslcert=")[0]
        expected = _expected(
            tls_postgres,
            WANTED,
        )
    assert (await asyncio.to_thread(_refusal, url)).endswith(expected)


@contextmanager
def _server_changed(
    cluster: PgCluster, certs: Certs, *, expired: bool, plain: bool
) -> Iterator[None]:
    """The cluster with the expired certificate, or without TLS, until the block ends."""
    saved = {path: path.read_bytes() for path in (certs.server.cert, certs.server.key)}
    conf = cluster.config_dir / "conf.d" / "90-plain.conf"  # after 10-tls.conf
    try:
        if expired:
            shutil.copyfile(certs.expired_server.cert, certs.server.cert)
            shutil.copyfile(certs.expired_server.key, certs.server.key)
        if plain:
            conf.parent.mkdir(exist_ok=True)
            conf.write_text("ssl = off\n")
        cluster.reload()
        yield
    finally:
        for path, data in saved.items():
            path.write_bytes(data)
        conf.unlink(missing_ok=True)
        cluster.reload()


@pytest.mark.parametrize("case", ["expired", "plain-server"])
async def test_a_server_whose_tls_changed_stops_a_command_with_one_line(
    tls_postgres: PgCluster, tls_certs: Certs, case: str
) -> None:
    """The cluster's own certificate expired, or its TLS turned off (reloaded, as an
    operator's change would be)."""
    url = postgres_url(tls_postgres, tls_certs)
    with _server_changed(
        tls_postgres, tls_certs, expired=case == "expired", plain=case == "plain-server"
    ):
        line = await asyncio.to_thread(_refusal, url)
    why = EXPIRED if case == "expired" else PLAIN
    assert line.endswith(_expected(tls_postgres, why))
    assert "Traceback" not in line


async def test_a_relay_whose_listen_url_is_refused_stops_with_one_line_naming_that_url(
    stack: support.Stack, tls_postgres: PgCluster, tls_certs: Certs
) -> None:
    """Behind a transaction pooler the relay LISTENs through a URL of its own: its TLS
    refused stops the relay at start, naming EXPIRY_DB_SESSION_URL (DATABASE_URL works),
    where it would otherwise have polled for ever, retrying what no retry can mend."""
    session_url = postgres_url(tls_postgres, tls_certs, root=tls_certs.wrong_ca)
    env = stack.env(EXPIRY_DB_POOLER="transaction", EXPIRY_DB_SESSION_URL=session_url)
    line = await asyncio.to_thread(refusal, "service.relay", env)
    where = f"PostgreSQL at localhost:{tls_postgres.port}"
    assert line.endswith(
        f": configuration error: EXPIRY_DB_SESSION_URL: TLS to {where} refused: {UNTRUSTED}"
    )
