"""The TLS options of the servers' URLs and the files they name, checked at start.

``AMQP_URL`` takes aiormq's query options (``amqps://...?cafile=CA&certfile=C&keyfile=K``,
``auth=external``, ``no_verify_ssl=1``), ``DATABASE_URL`` libpq's, as asyncpg reads them
(``sslmode=verify-full&sslrootcert=CA&sslcert=C&sslkey=K``), and the management API three
settings of its own (``EXPIRY_MANAGEMENT_CA_FILE`` ...). A file that is missing, unreadable
or not what it should be (a CA bundle, a certificate with its key, a key without a
passphrase for aiormq) is refused here with one line, never at the first connect, and so
are the options that would quietly turn the check off: TLS options on a plain ``amqp://``
URL, ``no_verify_ssl`` other than 0 or 1 (aiormq reads anything but "0" as "off"),
``sslrootcert`` under an ``sslmode`` that does not verify.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import parse_qsl

AMQP_TLS_OPTIONS = ("cafile", "capath", "cadata", "certfile", "keyfile", "no_verify_ssl")
AMQP_AUTH = ("plain", "external")
VERIFYING_SSLMODES = ("verify-ca", "verify-full")


class _Encrypted(Exception):
    """A key file asked for a passphrase."""


def check_amqp_tls(scheme: str, query: str) -> None:
    """Refuse an ``AMQP_URL`` node's TLS options that would fail or mislead (ValueError)."""
    options = _options(query)
    given = [name for name in AMQP_TLS_OPTIONS if name in options]
    if scheme == "amqp" and given:
        raise ValueError(
            f"{', '.join(given)} given on an amqp:// URL, which does not use TLS: "
            "use amqps:// (port 5671)"
        )
    auth = options.get("auth", "plain").lower()
    if auth not in AMQP_AUTH:
        raise ValueError(f"auth must be one of {', '.join(AMQP_AUTH)}")
    if auth == "external" and "certfile" not in options:
        raise ValueError("auth=external logs in with a client certificate: give certfile")
    if options.get("no_verify_ssl", "0") not in ("0", "1"):
        raise ValueError("no_verify_ssl must be 0 (verify the broker, the default) or 1")
    if "keyfile" in options and "certfile" not in options:
        raise ValueError("keyfile given without certfile")
    if "cafile" in options:
        _check_ca(options["cafile"], "cafile")
    if "certfile" in options:
        _check_pair(options["certfile"], options.get("keyfile"), "certfile", "keyfile", None)


def check_postgres_tls(query: str) -> None:
    """Refuse ``DATABASE_URL``'s TLS options that would fail or mislead (ValueError)."""
    options = _options(query)
    mode = options.get("sslmode", "prefer").replace("_", "-")
    root = options.get("sslrootcert")
    if root == "system":
        raise ValueError(
            "sslrootcert=system is libpq's word, which asyncpg reads as a file name: give "
            "the system's CA file itself (Debian: /etc/ssl/certs/ca-certificates.crt)"
        )
    if root is not None and mode not in VERIFYING_SSLMODES:
        raise ValueError(
            f"sslrootcert given with sslmode={mode}, which does not check the server's "
            "certificate: use sslmode=verify-full (or verify-ca)"
        )
    if root is not None:
        _check_ca(root, "sslrootcert")
    elif mode in VERIFYING_SSLMODES and not _default_root_exists():
        raise ValueError(
            f"sslmode={mode} without sslrootcert: give the CA file (the system's, for a "
            "server with a public CA: /etc/ssl/certs/ca-certificates.crt)"
        )
    if "sslkey" in options and "sslcert" not in options:
        raise ValueError("sslkey given without sslcert")
    if "sslcert" in options:
        _check_pair(
            options["sslcert"],
            options.get("sslkey"),
            "sslcert",
            "sslkey",
            options.get("sslpassword"),
        )


def check_management_tls(ca_file: str | None, cert_file: str | None, key_file: str | None) -> None:
    """Refuse the management API's CA, certificate and key files if they would fail (the
    message names the setting)."""
    ca, cert, key = (f"EXPIRY_MANAGEMENT_{name}_FILE" for name in ("CA", "CERT", "KEY"))
    if key_file is not None and cert_file is None:
        raise ValueError(f"{key}: given without {cert}")
    if ca_file is not None:
        _check_ca(ca_file, ca)
    if cert_file is not None:
        _check_pair(cert_file, key_file, cert, key, None)


def amqp_tls_files(query: str) -> Mapping[str, str]:
    """The files an AMQP URL's query names (``cafile``, ``certfile``, ``keyfile``)."""
    options = _options(query)
    return {name: options[name] for name in ("cafile", "certfile", "keyfile") if name in options}


def _default_root_exists() -> bool:
    """Whether asyncpg finds a CA without sslrootcert: PGSSLROOTCERT, or libpq's
    ~/.postgresql/root.crt."""
    if os.environ.get("PGSSLROOTCERT"):
        return True
    try:
        return (Path.home() / ".postgresql" / "root.crt").is_file()
    except RuntimeError:  # no home directory
        return False


def _options(query: str) -> dict[str, str]:
    return dict(parse_qsl(query, keep_blank_values=True))


def _check_ca(path: str, name: str) -> None:
    _check_readable(path, name)
    try:
        ssl.create_default_context(cafile=path)
    except (ssl.SSLError, OSError, ValueError):
        raise ValueError(f"{name} {path} holds no PEM certificate") from None


def _check_pair(
    cert: str, key: str | None, cert_name: str, key_name: str, password: str | None
) -> None:
    def passphrase() -> str:
        if password is None:
            raise _Encrypted
        return password

    _check_readable(cert, cert_name)
    if key is not None:
        _check_readable(key, key_name)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_cert_chain(cert, key, password=passphrase)
    except _Encrypted:
        encrypted = key_name if key is not None else cert_name
        raise ValueError(f"{encrypted} is encrypted: give a key without a passphrase") from None
    except (ssl.SSLError, OSError, ValueError):
        raise ValueError(
            f"{cert_name} and {key_name} are not a PEM certificate and its private key"
        ) from None


def _check_readable(path: str, name: str) -> None:
    if not os.path.isfile(path):
        raise ValueError(f"{name} {path} is not a file")
    if not os.access(path, os.R_OK):
        raise ValueError(f"{name} {path} cannot be read by this process's user")
