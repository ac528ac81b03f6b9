"""What the TLS tests expect a refused handshake to be said as (spelled out here, once,
not read from the code under test), and the one line a command stops with."""

from __future__ import annotations

from tests import support
from tests.acceptance.processes import base_env

UNTRUSTED = (
    "the server's certificate was refused: it is not signed by a trusted CA (check the CA "
    "file given, or the system's CAs)"
)
MISMATCH = (
    "the server's certificate was refused: it does not name the host connected to "
    "(connect by a name it has)"
)
EXPIRED = "the server's certificate was refused: it has expired"
PLAIN = "the server does not speak TLS there (a plain port where TLS was required)"
WANTED = "the server wants a client certificate (none given, or one it cannot use)"


def refusal(module: str, env: dict[str, str], *args: str) -> str:
    """The one line ``python -m module`` stopped with: exit 2, nothing else said, no
    password (the URLs' user guest) in it."""
    result = support.run_module(module, *args, env=base_env() | env, timeout=90)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1, result.stderr[-2000:]
    assert "guest" not in result.stderr
    return lines[0]
