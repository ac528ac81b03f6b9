"""The servers the TLS tests start: a RabbitMQ node with an amqps listener and an https
management API, both asking for a client certificate (EXTERNAL login by its common name),
and a PostgreSQL cluster that takes only TLS with a client certificate (``cert`` login);
and a bare TLS server for what the real ones cannot be made to show cheaply (an expired
certificate on the broker's side)."""

from __future__ import annotations

import contextlib
import secrets
import socket
import ssl
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode

from tests.faults.nodes import PgCluster
from tests.rabbitnode import RabbitNode, free_port_block
from tests.tls.certs import SERVER_HOST, Certs, Pair


@dataclass
class TlsRabbitNode(RabbitNode):
    """A private node whose TLS listener and https API ask for a client certificate."""

    certs: Certs | None = None
    tls_port: int = field(default_factory=lambda: free_port_block(2))

    @property
    def https_port(self) -> int:
        """The management API's https port."""
        return self.tls_port + 1

    def _write_files(self) -> None:
        fresh = not (self.home / ".erlang.cookie").exists()
        super()._write_files()
        if not fresh or self.certs is None:
            return
        certs = self.certs
        files = (
            f"cacertfile = {certs.ca}\n"
            f"certfile = {certs.server.cert}\n"
            f"keyfile = {certs.server.key}\n"
            "verify = verify_peer\n"
            "fail_if_no_peer_cert = true\n"
        )
        with (self.home / "rabbitmq.conf").open("a") as conf:
            conf.write(
                f"listeners.ssl.local = 127.0.0.1:{self.tls_port}\n"
                + "".join(f"ssl_options.{line}\n" for line in files.splitlines())
                + "auth_mechanisms.1 = PLAIN\n"
                "auth_mechanisms.2 = EXTERNAL\n"
                "ssl_cert_login_from = common_name\n"
                f"management.ssl.port = {self.https_port}\n"
                "management.ssl.ip = 127.0.0.1\n"
                + "".join(f"management.ssl.{line}\n" for line in files.splitlines())
            )
        (self.home / "enabled_plugins").write_text(
            "[rabbitmq_management,rabbitmq_auth_mechanism_ssl].\n"
        )

    def amqps_url(
        self,
        vhost: str = "",
        *,
        host: str = SERVER_HOST,
        port: int | None = None,
        user: str | None = "guest:guest",
        options: Mapping[str, str | Path],
    ) -> str:
        """An amqps:// URL of this node (``options``: aiormq's query, e.g. cafile)."""
        who = f"{user}@" if user else ""
        query = urlencode({name: str(value) for name, value in options.items()})
        return f"amqps://{who}{host}:{port or self.tls_port}/{vhost}" + (
            f"?{query}" if query else ""
        )

    @property
    def https_url(self) -> str:
        """The https API (by the name its certificate has)."""
        return f"https://guest:guest@{SERVER_HOST}:{self.https_port}"


def client_options(certs: Certs, client: Pair | None = None) -> dict[str, str | Path]:
    """AMQP_URL's query for a client of ``certs``' CA (with ``client``'s certificate)."""
    client = client or certs.external_client
    return {"cafile": certs.ca, "certfile": client.cert, "keyfile": client.key}


HBA = "local all all trust\nhostssl all all 127.0.0.1/32 cert\nhostssl all all ::1/128 cert\n"


def tls_cluster(certs: Certs) -> PgCluster:
    """A private cluster that takes TLS alone, and a client certificate as the login (its
    TLS in conf.d/10-tls.conf: pg_createcluster leaves an ``ssl`` option of its own out)."""
    cluster = PgCluster(name=f"tls{secrets.token_hex(4)}")
    cluster.create()
    (cluster.config_dir / "conf.d" / "10-tls.conf").write_text(
        "ssl = on\n"
        f"ssl_cert_file = '{certs.server.cert}'\n"
        f"ssl_key_file = '{certs.server.key}'\n"
        f"ssl_ca_file = '{certs.ca}'\n"
    )
    (cluster.config_dir / "pg_hba.conf").write_text(HBA)
    cluster.reload()
    return cluster


def postgres_url(
    cluster: PgCluster,
    certs: Certs,
    *,
    host: str = SERVER_HOST,
    port: int | None = None,
    root: Path | None = None,
    client: Pair | None = None,
    database: str = "postgres",
) -> str:
    """A verify-full URL of ``cluster`` (``root``: the CA to check the server with)."""
    client = client or certs.postgres_client
    query = urlencode(
        {
            "sslmode": "verify-full",
            "sslrootcert": str(root or certs.ca),
            "sslcert": str(client.cert),
            "sslkey": str(client.key),
        }
    )
    return f"postgresql://postgres@{host}:{port or cluster.port}/{database}?{query}"


def server_context(pair: Pair, client_ca: Path | None = None) -> ssl.SSLContext:
    """A server's TLS with ``pair`` (asking for a client certificate of ``client_ca``)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pair.cert, pair.key)
    if client_ca is not None:
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


@contextlib.contextmanager
def handshake_server(context: ssl.SSLContext | None) -> Iterator[int]:
    """A server on the loopback (its port) that handshakes with ``context`` (None: plain),
    blocking, so that OpenSSL's alert goes out before the close, as a real server's does;
    then says what a plain AMQP port says to a stranger, and hangs up."""
    listener = socket.create_server(("127.0.0.1", 0))
    thread = threading.Thread(target=_serve, args=(listener, context), daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(10)


def _serve(listener: socket.socket, context: ssl.SSLContext | None) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return  # closed
        with contextlib.suppress(OSError), conn:
            conn.settimeout(5)
            stream = conn if context is None else context.wrap_socket(conn, server_side=True)
            stream.sendall(b"AMQP\x00\x00\x09\x01")  # what a plain AMQP port says to a stranger
            stream.recv(100)
