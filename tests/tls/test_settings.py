"""The TLS options of AMQP_URL, DATABASE_URL and the management API's files are checked at
start: what would fail at the first connect, or quietly turn verification off, stops the
command with one line naming the setting, and what is right passes."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlencode

import pytest

from service.core.errors import ConfigError
from service.settings import load_settings
from tests.tls.certs import Certs, make_certs

MQ = "amqps://guest:guest@localhost:5671/"
PG = "postgresql://postgres@localhost:5432/postgres"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def _load(monkeypatch: pytest.MonkeyPatch, **env: str) -> str:
    """The one line ``load_settings`` refuses with, or "ok"."""
    for name in ("AMQP_URL", "DATABASE_URL", "PGSSLROOTCERT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", "/nonexistent")  # no ~/.postgresql/root.crt
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    try:
        load_settings()
    except ConfigError as exc:
        return str(exc)
    return "ok"


def _q(**options: object) -> str:
    return "?" + urlencode({k: str(v) for k, v in options.items()})


def test_right_options_pass(monkeypatch: pytest.MonkeyPatch, certs: Certs) -> None:
    mq = MQ + _q(
        cafile=certs.ca, certfile=certs.external_client.cert, keyfile=certs.external_client.key
    )
    pg = PG + _q(
        sslmode="verify-full",
        sslrootcert=certs.ca,
        sslcert=certs.postgres_client.cert,
        sslkey=certs.postgres_client.key,
    )
    assert _load(monkeypatch, AMQP_URL=mq + "&auth=external", DATABASE_URL=pg) == "ok"
    assert _load(monkeypatch, AMQP_URL=MQ, DATABASE_URL=PG + "?sslmode=require") == "ok"
    assert (
        _load(
            monkeypatch,
            EXPIRY_MANAGEMENT_CA_FILE=str(certs.ca),
            EXPIRY_MANAGEMENT_CERT_FILE=str(certs.external_client.cert),
            EXPIRY_MANAGEMENT_KEY_FILE=str(certs.external_client.key),
        )
        == "ok"
    )


def test_amqp_url_options_that_would_fail_or_mislead_are_refused(
    monkeypatch: pytest.MonkeyPatch, certs: Certs, tmp_path: Path
) -> None:
    missing = tmp_path / "nowhere.pem"
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello")
    cases = {
        "amqp://guest:guest@localhost:5672/" + _q(cafile=certs.ca): (
            "AMQP_URL: cafile given on an amqp:// URL, which does not use TLS: use amqps:// "
            "(port 5671)"
        ),
        MQ + _q(cafile=missing): f"AMQP_URL: cafile {missing} is not a file",
        MQ + _q(cafile=not_pem): f"AMQP_URL: cafile {not_pem} holds no PEM certificate",
        MQ + _q(no_verify_ssl="false"): (
            "AMQP_URL: no_verify_ssl must be 0 (verify the broker, the default) or 1"
        ),
        MQ + _q(auth="kerberos"): "AMQP_URL: auth must be one of plain, external",
        MQ + _q(auth="external"): (
            "AMQP_URL: auth=external logs in with a client certificate: give certfile"
        ),
        MQ + _q(keyfile=certs.server.key): "AMQP_URL: keyfile given without certfile",
        MQ + _q(certfile=certs.server.cert, keyfile=certs.external_client.key): (
            "AMQP_URL: certfile and keyfile are not a PEM certificate and its private key"
        ),
        MQ + _q(certfile=certs.server.cert, keyfile=certs.encrypted_key): (
            "AMQP_URL: keyfile is encrypted: give a key without a passphrase"
        ),
    }
    for url, line in cases.items():
        assert _load(monkeypatch, AMQP_URL=url) == line
        assert "guest" not in line  # never the URL


def test_database_url_options_that_would_fail_or_mislead_are_refused(
    monkeypatch: pytest.MonkeyPatch, certs: Certs
) -> None:
    cases = {
        PG + _q(sslrootcert=certs.ca): (
            "DATABASE_URL: sslrootcert given with sslmode=prefer, which does not check the "
            "server's certificate: use sslmode=verify-full (or verify-ca)"
        ),
        PG + _q(sslmode="require", sslrootcert=certs.ca): (
            "DATABASE_URL: sslrootcert given with sslmode=require, which does not check the "
            "server's certificate: use sslmode=verify-full (or verify-ca)"
        ),
        PG + _q(sslmode="verify-full", sslrootcert="system"): (
            "DATABASE_URL: sslrootcert=system is libpq's word, which asyncpg reads as a file "
            "name: give the system's CA file itself (Debian: /etc/ssl/certs/ca-certificates.crt)"
        ),
        PG + _q(sslmode="verify-full", sslrootcert=certs.server.key): (
            f"DATABASE_URL: sslrootcert {certs.server.key} holds no PEM certificate"
        ),
        PG + _q(sslmode="verify-full"): (
            "DATABASE_URL: sslmode=verify-full without sslrootcert: give the CA file (the "
            "system's, for a server with a public CA: /etc/ssl/certs/ca-certificates.crt)"
        ),
        PG + _q(sslkey=certs.postgres_client.key): "DATABASE_URL: sslkey given without sslcert",
        PG + _q(sslcert=certs.postgres_client.cert, sslkey=certs.encrypted_key): (
            "DATABASE_URL: sslkey is encrypted: give a key without a passphrase"
        ),
    }
    for url, line in cases.items():
        assert _load(monkeypatch, DATABASE_URL=url) == line
    session = PG + _q(sslmode="disable", sslrootcert=certs.ca)
    assert _load(monkeypatch, EXPIRY_DB_SESSION_URL=session).startswith(
        "EXPIRY_DB_SESSION_URL: sslrootcert given with sslmode=disable"
    )


def test_the_management_files_are_checked_by_name(
    monkeypatch: pytest.MonkeyPatch, certs: Certs, tmp_path: Path
) -> None:
    missing = tmp_path / "nowhere.pem"
    assert (
        _load(monkeypatch, EXPIRY_MANAGEMENT_CA_FILE=str(missing))
        == f"EXPIRY_MANAGEMENT_CA_FILE {missing} is not a file"
    )
    monkeypatch.delenv("EXPIRY_MANAGEMENT_CA_FILE")
    assert (
        _load(monkeypatch, EXPIRY_MANAGEMENT_KEY_FILE=str(certs.server.key))
        == "EXPIRY_MANAGEMENT_KEY_FILE: given without EXPIRY_MANAGEMENT_CERT_FILE"
    )
