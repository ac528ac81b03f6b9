"""A transaction pooler for the tests: ``bench/pgbouncer.py``'s PgBouncer, started in front
of a PostgreSQL server as production sets it up (``pool_mode = transaction``, only
``extra_float_digits`` ignored among the start-up parameters), on a free loopback port.

The pooler leg (``scripts/dev test --pooler``, ``.ci/run``) sets ``TEST_POOLER=pgbouncer``:
the ``stack`` fixture's settings (and the fault scenarios' service processes) then reach
the test's database through it (``EXPIRY_DB_POOLER=transaction``), while the tests' own
reads go straight to the server. Where the package is missing, the tests that need it
skip (fail under ``CI=true``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from bench.pgbouncer import PgBouncerMissing, Pooler
from bench.pgbouncer import running_pgbouncer as _running
from tests.support import missing

__all__ = ["Pooler", "running_pgbouncer", "wanted"]


def wanted() -> bool:
    """Whether this run is the pooler leg."""
    return os.environ.get("TEST_POOLER", "") == "pgbouncer"


@contextlib.contextmanager
def running_pgbouncer(database_url: str, *, pool_size: int = 40) -> Iterator[Pooler]:
    """PgBouncer in front of ``database_url``'s server for the block; the test skips
    (fails under CI) where the machine has none."""
    try:
        with _running(database_url, pool_size=pool_size) as running:
            yield running
    except PgBouncerMissing as exc:
        missing(f"{exc}: the pooler's tests need it")
