"""Unit tests for service.core.dsn: every URL form asyncpg accepts, and no URL in an error."""

from __future__ import annotations

import pytest

from service.core.dsn import DEFAULT_HOSTS, DsnError, Host, parse_dsn, with_database

SOCKETS = "/var/run/postgresql"


@pytest.mark.parametrize(
    ("dsn", "hosts"),
    [
        ("postgresql://postgres@localhost:5432/postgres", ["localhost:5432"]),
        ("postgres://u:p@db/app", ["db:5432"]),
        ("postgresql://u@h1:5432,h2:5433/db", ["h1:5432", "h2:5433"]),
        ("postgresql://h1:1,h2/db", ["h1:1", "h2:5432"]),
        (
            "postgresql://u@h1:5432,h2:5432/db?target_session_attrs=read-write",
            ["h1:5432", "h2:5432"],
        ),
        ("postgresql://[::1]:5433/db", ["[::1]:5433"]),
        ("postgresql://[::1],[fe80::1]:99/db", ["[::1]:5432", "[fe80::1]:99"]),
        ("postgresql://h:/db", ["h:5432"]),
        ("postgresql:///db?host=/var/run/postgresql&port=5433", [f"{SOCKETS}/.s.PGSQL.5433"]),
        (
            "postgresql:///postgres?host=/var/run/postgresql&user=postgres",
            [f"{SOCKETS}/.s.PGSQL.5432"],
        ),
        ("postgresql://%2Fvar%2Frun%2Fpostgresql/db", [f"{SOCKETS}/.s.PGSQL.5432"]),
        ("postgresql://%2Fvar%2Frun%2Fpostgresql:5433/db", [f"{SOCKETS}/.s.PGSQL.5433"]),
        ("postgresql:///db?host=a,b&port=1,2", ["a:1", "b:2"]),
        ("postgresql:///db?host=a:7,b:8", ["a:7", "b:8"]),
        ("postgresql:///db?host=a,b&port=6", ["a:6", "b:6"]),
        ("postgresql://u:p%40ss%2F%3A%25%23%3F@h/db?sslmode=require", ["h:5432"]),
        ("postgresql://h/db?sslmode=verify_full&application_name=x%40y", ["h:5432"]),
        ("POSTGRESQL://h/db", ["h:5432"]),
    ],
)
def test_accepted_forms_name_their_hosts(dsn: str, hosts: list[str]) -> None:
    """Each form asyncpg accepts is accepted, its hosts listed as asyncpg would try them."""
    parsed = parse_dsn(dsn)
    assert [str(host) for host in parsed.hosts] == hosts
    assert parsed.hosts_given


@pytest.mark.parametrize("dsn", ["postgresql:///db", "postgresql://user@/db", "postgresql://"])
def test_no_host_means_asyncpgs_defaults(dsn: str) -> None:
    """Without a host asyncpg tries the usual socket directories, then localhost."""
    parsed = parse_dsn(dsn)
    assert [host.address for host in parsed.hosts] == list(DEFAULT_HOSTS)
    assert {host.port for host in parsed.hosts} == {5432}
    assert not parsed.hosts_given


def test_pghost_and_pgport_count_when_the_url_names_no_host() -> None:
    """PGHOST and PGPORT (passed in, as asyncpg reads them) fill in what the URL leaves out."""
    env = {"PGHOST": "db1,db2", "PGPORT": "6000"}
    assert [str(h) for h in parse_dsn("postgresql:///x", env).hosts] == ["db1:6000", "db2:6000"]
    assert [str(h) for h in parse_dsn("postgresql://h/x", env).hosts] == ["h:6000"]
    assert [str(h) for h in parse_dsn("postgresql://h:7/x", env).hosts] == ["h:7"]


def test_credentials_database_and_session_attributes_are_read() -> None:
    """User, password and database are percent-decoded; query values fill in the rest."""
    parsed = parse_dsn("postgresql://app%40x:p%40ss%2Fw@h/my%20db?target_session_attrs=primary")
    assert (parsed.user, parsed.password, parsed.database) == ("app@x", "p@ss/w", "my db")
    assert parsed.target_session_attrs == "primary"
    from_query = parse_dsn("postgresql:///?host=h&user=u&password=pw&dbname=d")
    assert (from_query.user, from_query.password, from_query.database) == ("u", "pw", "d")


def test_socket_paths() -> None:
    """A directory gets asyncpg's socket file name; a full socket path is kept."""
    assert Host("/tmp/", 5433).socket_path == "/tmp/.s.PGSQL.5433"
    assert Host("/tmp/.s.PGSQL.7", 5432).socket_path == "/tmp/.s.PGSQL.7"
    assert Host("db", 5432).socket_path is None


@pytest.mark.parametrize(
    ("dsn", "message"),
    [
        ("mysql://u:Secret1@h/db", "must start with postgresql:// or postgres://"),
        ("postgresql://u:Secret1@h:port/db", "not a valid URL: a port must be a number"),
        ("postgresql://u:Secret1@h:0/db", "not a valid URL: a port must be a number"),
        ("postgresql://u:Secret1@h:65536/db", "not a valid URL: a port must be a number"),
        ("postgresql://u:Secret1@h:+5/db", "not a valid URL: a port must be a number"),
        ("postgresql://u:Secret1@h1:5432,h2:x/db", "not a valid URL: a port must be a number"),
        ("postgresql:///db?host=h&port=Secret1", "not a valid URL: a port must be a number"),
        ("postgresql:///db?host=a,b&port=1,2,3", "not a valid URL: 3 ports for 2 hosts"),
        ("postgresql://u:Secret1@h1,,h2/db", "not a valid URL: an empty host"),
        ("postgresql://u:Secret1@[::1/db", "not a valid URL: it cannot be parsed"),
        ("postgresql://u:Secret1@[::1]x/db", "not a valid URL: an IPv6 host must be"),
        ("postgresql://u:Sec@ret1@h/db", "not a valid URL: a raw @ in the host part"),
        ("postgresql://u:Sec/ret1@h/db", "not a valid URL: a raw @ after the host part"),
        ("postgresql://u:12/Secret1@h/db", "not a valid URL: a raw @ after the host part"),
        ("postgresql://u:Sec?ret1@h/db", "not a valid URL: a raw @ after the host part"),
        ("postgresql://u:Sec#ret1@h/db", "not a valid URL: a raw #"),
        ("postgresql://h/db?Secret1", "not a valid URL: the query is not name=value pairs"),
        ("postgresql://h/db?target_session_attrs=Secret1", "target_session_attrs must be one of"),
        ("postgresql://h/db?sslmode=Secret1", "sslmode must be one of"),
    ],
)
def test_refused_forms_say_why_without_quoting_the_url(dsn: str, message: str) -> None:
    """A refused URL gets a reason that quotes no part of it (it may hold a password)."""
    with pytest.raises(DsnError) as caught:
        parse_dsn(dsn)
    text = str(caught.value)
    assert text.startswith(message)
    for part in ("Secret1", "Sec", "ret1", "[::1", "h1"):
        assert part not in text


def test_target_session_attrs_accepts_asyncpgs_values() -> None:
    """Every value asyncpg knows is accepted."""
    for value in ("any", "primary", "standby", "prefer-standby", "read-write", "read-only"):
        assert parse_dsn(f"postgresql://h/db?target_session_attrs={value}").target_session_attrs


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        ("postgresql://u:p%40@h1:1,h2:2/db?x=1", "postgresql://u:p%40@h1:1,h2:2/demo?x=1"),
        (
            "postgresql:///db?host=/var/run/postgresql",
            "postgresql:///demo?host=/var/run/postgresql",
        ),
        ("postgres://h", "postgres://h/demo"),
    ],
)
def test_with_database_keeps_hosts_and_query(dsn: str, expected: str) -> None:
    """Only the database changes; a URL without a host keeps its ``//``."""
    assert with_database(dsn, "demo") == expected
