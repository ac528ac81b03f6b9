"""The certificates the TLS tests hand the servers and the service (trustme), as files.

One CA signs the servers' certificates (for ``localhost`` only, so that ``127.0.0.1`` is
a host name mismatch), an expired one, and the client certificates (``CN=postgres`` for
PostgreSQL's ``cert`` login, ``CN=expiry-tls`` for RabbitMQ's EXTERNAL); another CA, which
nobody trusts, stands for the wrong one. The servers run as other users (PostgreSQL as
``postgres``), so the directory and the files are theirs to read, and a server's key is
``0600`` as PostgreSQL demands.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import trustme

SERVER_HOST = "localhost"
MISMATCHED_HOST = "127.0.0.1"  # the same server, by a name its certificate does not have
POSTGRES_USER = "postgres"
EXTERNAL_USER = "expiry-tls"


@dataclass(frozen=True)
class Pair:
    """A certificate (with its chain) and its key, as files."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class Certs:
    """Every file the TLS tests use."""

    ca: Path  # signs everything below
    wrong_ca: Path  # signs nothing here
    server: Pair  # for localhost
    expired_server: Pair  # for localhost, expired yesterday
    postgres_client: Pair  # CN=postgres
    external_client: Pair  # CN=expiry-tls
    encrypted_key: Path  # a key with a passphrase (refused by the settings)


def make_certs(folder: Path, owner: str | None = None) -> Certs:
    """Write the CAs, the certificates and their keys into ``folder`` (readable by
    ``owner`` too, when given: the user a server runs as)."""
    folder.mkdir(parents=True, exist_ok=True)
    ca, wrong = trustme.CA(), trustme.CA()
    now = datetime.now(UTC)
    files = Certs(
        ca=_write(folder / "ca.pem", ca.cert_pem.bytes()),
        wrong_ca=_write(folder / "wrong-ca.pem", wrong.cert_pem.bytes()),
        server=_pair(folder, "server", ca.issue_cert(SERVER_HOST)),
        expired_server=_pair(
            folder,
            "expired",
            ca.issue_cert(
                SERVER_HOST,
                not_before=now - timedelta(days=30),
                not_after=now - timedelta(days=1),
            ),
        ),
        postgres_client=_pair(
            folder, "pg-client", ca.issue_cert("client.test", common_name=POSTGRES_USER)
        ),
        external_client=_pair(
            folder, "mq-client", ca.issue_cert("client.test", common_name=EXTERNAL_USER)
        ),
        encrypted_key=_write(folder / "encrypted.key", _encrypted(ca)),
    )
    if owner is not None:
        for path in [folder, *folder.iterdir()]:
            shutil.chown(path, owner)
    return files


def _pair(folder: Path, name: str, leaf: trustme.LeafCert) -> Pair:
    chain = b"".join(blob.bytes() for blob in leaf.cert_chain_pems)
    return Pair(
        _write(folder / f"{name}.pem", chain),
        _write(folder / f"{name}.key", leaf.private_key_pem.bytes()),
    )


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    os.chmod(path, 0o600 if path.suffix == ".key" else 0o644)
    return path


def _encrypted(ca: trustme.CA) -> bytes:
    from cryptography.hazmat.primitives import serialization

    leaf = ca.issue_cert(SERVER_HOST)
    key = serialization.load_pem_private_key(leaf.private_key_pem.bytes(), password=None)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"a passphrase"),
    )
