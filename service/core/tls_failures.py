"""What a failed TLS handshake means, in words an operator can act on: pure.

A connection refused for its TLS (a CA that did not sign the server's certificate, a
certificate that names another host or has expired, a plain server where TLS was asked
for, a client certificate missing or refused) is a configuration error: trying again
cannot help, so the commands stop at start with one line naming the setting
(``TlsRefused``), never a traceback. ``tls_failure`` finds the cause in an exception's
chain (the libraries wrap it: aiormq in ``AMQPConnectionError``, urllib in ``URLError``)
and says it without quoting any URL or secret.
"""

from __future__ import annotations

import ssl

from service.core.errors import ConfigError

# OpenSSL's X509_V_ERR_* codes (ssl.SSLCertVerificationError.verify_code), by meaning.
_UNTRUSTED = {
    2: "its issuer's certificate is not among the trusted CAs",
    7: "its signature does not verify",
    18: "it is self-signed and not among the trusted CAs",
    19: "it is not signed by a trusted CA",  # its chain ends in an untrusted root
    20: "it is not signed by a trusted CA",
    21: "it is not signed by a trusted CA",
}
_EXPIRED, _NOT_YET_VALID, _REVOKED = 10, 9, 23
_HOST_MISMATCH = (62, 64)

# ssl.SSLError.reason values (OpenSSL's reason codes), by meaning.
_PLAIN_SERVER = {
    "WRONG_VERSION_NUMBER",
    "RECORD_LAYER_FAILURE",
    "PACKET_LENGTH_TOO_LONG",
    "HTTP_REQUEST",
    "UNKNOWN_PROTOCOL",
}
_CLIENT_CERT_WANTED = {"TLSV13_ALERT_CERTIFICATE_REQUIRED", "SSLV3_ALERT_HANDSHAKE_FAILURE"}
_CLIENT_CERT_REFUSED = {
    "TLSV1_ALERT_UNKNOWN_CA",
    "SSLV3_ALERT_BAD_CERTIFICATE",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED",
    "SSLV3_ALERT_CERTIFICATE_REVOKED",
    "TLSV1_ALERT_ACCESS_DENIED",
    "TLSV1_ALERT_DECRYPT_ERROR",
}

# asyncpg's words for a server that answered "no TLS here" to sslmode=require and above,
# and PostgreSQL's for a login (pg_hba.conf's ``cert``) that needs a client certificate.
_POSTGRES_NO_TLS = "rejected SSL upgrade"
_POSTGRES_CERT_LOGIN = "requires a valid client certificate"

PLAIN_SERVER = "the server does not speak TLS there (a plain port where TLS was required)"
CLIENT_CERT_WANTED = "the server wants a client certificate (none given, or one it cannot use)"


class TlsRefused(ConfigError):
    """A server's TLS was refused, or it refused ours: one line naming the setting."""


def tls_failure(exc: BaseException | None) -> str | None:
    """What went wrong with TLS, if the cause of ``exc`` (or ``exc`` itself) is a TLS
    failure; None for any other failure (a refused port, a timeout, a password)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        found = _one(exc)
        if found is not None:
            return found
        reason = getattr(exc, "reason", None)  # urllib's URLError carries the SSLError here
        if isinstance(reason, BaseException) and id(reason) not in seen:
            found = _one(reason)
            if found is not None:
                return found
        exc = exc.__cause__ or exc.__context__
    return None


def _one(exc: BaseException) -> str | None:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return "the server's certificate was refused: " + _verification(exc)
    if isinstance(exc, ssl.SSLError):
        return _alert(exc)
    if isinstance(exc, ConnectionError) and _POSTGRES_NO_TLS in str(exc):
        return PLAIN_SERVER
    if _POSTGRES_CERT_LOGIN in str(exc):
        return CLIENT_CERT_WANTED
    return None


def _verification(exc: ssl.SSLCertVerificationError) -> str:
    code = exc.verify_code
    if code in _UNTRUSTED:
        return f"{_UNTRUSTED[code]} (check the CA file given, or the system's CAs)"
    if code in _HOST_MISMATCH:
        return "it does not name the host connected to (connect by a name it has)"
    if code == _EXPIRED:
        return "it has expired"
    if code == _NOT_YET_VALID:
        return "it is not valid yet (is a clock wrong?)"
    if code == _REVOKED:
        return "it has been revoked"
    return str(exc.verify_message or "certificate verify failed")


def _alert(exc: ssl.SSLError) -> str | None:
    reason = str(exc.reason or "")
    if reason in _PLAIN_SERVER:
        return PLAIN_SERVER
    if reason in _CLIENT_CERT_WANTED:
        return CLIENT_CERT_WANTED
    if reason in _CLIENT_CERT_REFUSED:
        return f"the server refused the client certificate ({reason.lower()})"
    if reason == "CERTIFICATE_VERIFY_FAILED":
        return "the server's certificate was refused"
    return None  # an end of stream, a reset: the server went away, which may pass


def refused(setting: str, where: str, why: str) -> TlsRefused:
    """The one line: ``SETTING: TLS to WHERE refused: WHY``."""
    return TlsRefused(f"{setting}: TLS to {where} refused: {why}")
