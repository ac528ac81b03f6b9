"""A local PgBouncer as production sets one up, for the benchmark's pooler phase and the
tests (``tests/pooler.py``): Debian's package (1.18), ``pool_mode = transaction``, only
``extra_float_digits`` ignored among the start-up parameters, trust for the service's
login roles, on a free loopback port in front of one PostgreSQL server; run as
``postgres`` when started as root (PgBouncer will not run as root).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

PGBOUNCER = "/usr/sbin/pgbouncer"
# The login roles the tests and the service use (PgBouncer's trust still needs each name).
ROLES = (
    "postgres",
    "expiry_consumer",
    "expiry_scan",
    "expiry_operator",
    "expiry_relay",
    "expiry_deliver",
)
START_SECONDS = 10.0


class PgBouncerMissing(RuntimeError):
    """The machine has no PgBouncer."""


@dataclass(frozen=True)
class Pooler:
    """A running PgBouncer: its port, and its log file."""

    port: int
    log: Path

    def url_for(self, database_url: str) -> str:
        """``database_url`` through this pooler (same user, database and options)."""
        parts = urlsplit(database_url)
        user = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{self.port}"))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _config(
    folder: Path, port: int, upstream_host: str, upstream_port: int, pool_size: int
) -> Path:
    users = folder / "users.txt"
    users.write_text("".join(f'"{role}" ""\n' for role in ROLES), encoding="utf-8")
    ini = folder / "pgbouncer.ini"
    ini.write_text(
        f"""[databases]
* = host={upstream_host} port={upstream_port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {users}
pool_mode = transaction
ignore_startup_parameters = extra_float_digits
max_client_conn = 2000
default_pool_size = {pool_size}
max_db_connections = 0
server_connect_timeout = 5
server_login_retry = 1
logfile = {folder / "pgbouncer.log"}
pidfile = {folder / "pgbouncer.pid"}
""",
        encoding="utf-8",
    )
    return ini


@contextlib.contextmanager
def running_pgbouncer(database_url: str, *, pool_size: int = 40) -> Iterator[Pooler]:
    """PgBouncer in front of ``database_url``'s server for the block (stopped after)."""
    if not Path(PGBOUNCER).exists():
        raise PgBouncerMissing(f"{PGBOUNCER} is missing: Debian's pgbouncer package")
    upstream = urlsplit(database_url)
    folder = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
    folder.chmod(0o755)
    port = _free_port()
    ini = _config(folder, port, upstream.hostname or "127.0.0.1", upstream.port or 5432, pool_size)
    command = [PGBOUNCER, ini.as_posix()]
    if os.geteuid() == 0:  # PgBouncer will not run as root
        shutil.chown(folder, "postgres")
        for item in folder.iterdir():
            shutil.chown(item, "postgres")
        command = [PGBOUNCER, "-u", "postgres", ini.as_posix()]
    output = (folder / "output.log").open("wb")
    process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    try:
        _wait_for(port, process, folder)
        yield Pooler(port, folder / "pgbouncer.log")
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        output.close()
        shutil.rmtree(folder, ignore_errors=True)


def _wait_for(port: int, process: subprocess.Popen[bytes], folder: Path) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            said = (folder / "output.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"pgbouncer exited at start ({process.returncode}): {said}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"pgbouncer did not listen on {port} within {START_SECONDS:g}s")
