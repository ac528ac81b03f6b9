"""Who may use the console: operators with scrypt-hashed passwords, or the name a trusted
reverse proxy puts in a header; and the CSRF token every state-changing form carries.

A hash is ``scrypt$<n>$<r>$<p>$<salt>$<key>`` (base64, no padding), made by
``python -m service.console hash-password``; the password never leaves it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Iterable

SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**15, 8, 1
KEY_BYTES = 32
# A hash with a cost above this is refused rather than computed (a setting could
# otherwise make every login take minutes and gigabytes).
MAX_SCRYPT_N = 2**20
PASSWORD_LIMIT = 1024


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _derive(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(
        password.encode(), salt=salt, n=n, r=r, p=p, dklen=KEY_BYTES, maxmem=256 * 1024 * 1024
    )


def hash_password(password: str) -> str:
    """A new scrypt hash of ``password`` (random salt)."""
    salt = secrets.token_bytes(16)
    key = _derive(password, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${_b64(salt)}${_b64(key)}"


def verify_password(password: str, hashed: str) -> bool:
    """Whether ``password`` matches ``hashed``; False for anything malformed."""
    if len(password) > PASSWORD_LIMIT:
        return False
    try:
        scheme, n, r, p, salt, key = hashed.split("$")
        cost = (int(n), int(r), int(p))
        if scheme != "scrypt" or not (1 < cost[0] <= MAX_SCRYPT_N) or min(cost) < 1:
            return False
        expected = _unb64(key)
        derived = _derive(password, _unb64(salt), *cost)
    except ValueError:
        return False
    return hmac.compare_digest(derived, expected)


def users_from(entries: Iterable[str]) -> dict[str, str]:
    """``EXPIRY_CONSOLE_USERS`` (``name:hash``, validated by the settings) by name."""
    return {name: hashed for name, _, hashed in (entry.partition(":") for entry in entries)}


# A hash to check against when the name is unknown, so that a login for a name that
# does not exist takes as long as one with a wrong password.
_DECOY = hash_password(secrets.token_urlsafe(16))


def authenticate(users: dict[str, str], name: str, password: str) -> bool:
    """Whether ``name`` is an operator whose password this is (constant work either way)."""
    hashed = users.get(name)
    matched = verify_password(password, hashed or _DECOY)
    return hashed is not None and matched


def new_csrf_token() -> str:
    """A token for one session's forms."""
    return secrets.token_urlsafe(32)


def csrf_matches(expected: object, given: object) -> bool:
    """Whether a form's token is the session's (both non-empty strings)."""
    if not isinstance(expected, str) or not isinstance(given, str) or not expected:
        return False
    return hmac.compare_digest(expected.encode(), given.encode())
