"""Versioned schema migrations: the SQL files in ``migrations/``, each applied once.

Each file runs once, in its own transaction, and is recorded in
``schema_migrations``. An advisory lock (``locks.py``: held by a transaction of a
connection of its own, so that it holds through a transaction pooler too) makes two
concurrent runs take turns; the second finds nothing left to do. The lock is waited for
by polling, not under ``lock_timeout``: that bounds each migration's statements against
the running service, while the other run may take longer than it to apply them all.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib import resources

from service.adapters.postgres.locks import LockBusy, holding
from service.adapters.postgres.pool import Connection, connect, transaction
from service.core.errors import ServiceError
from service.settings import Settings

log = logging.getLogger("service.migrate")

# An arbitrary constant shared by every migrate process: hashtext('service.migrate').
MIGRATION_LOCK_KEY = 0x6D696772

CREATE_LEDGER = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version     text PRIMARY KEY,
    applied_at  timestamptz NOT NULL DEFAULT now()
)
"""
APPLIED_VERSIONS = "SELECT version FROM schema_migrations"
# Whether the ledger exists, and whether this session may read it (no privilege is
# needed to ask either).
LEDGER_ACCESS = """
SELECT to_regclass('schema_migrations') IS NOT NULL AS present,
       coalesce(has_table_privilege(to_regclass('schema_migrations'), 'SELECT'), false)
           AS readable
"""
# The migration that lets the operator's role read the ledger: a role that may not read
# it is on a schema older than this.
LEDGER_READABLE_FROM = "0010_scan_pass_start"
RECORD_VERSION = "INSERT INTO schema_migrations (version) VALUES ($1)"
LOCK_WAIT_SECONDS = 600.0  # another run's migrations, however slow the server


@dataclass(frozen=True)
class Migration:
    """One SQL file: its version is the file name without ``.sql``."""

    version: str
    sql: str


def load_migrations() -> list[Migration]:
    """All migrations shipped with the package, in version order."""
    folder = resources.files("service.adapters.postgres").joinpath("migrations")
    files = sorted(
        (entry for entry in folder.iterdir() if entry.name.endswith(".sql")),
        key=lambda entry: entry.name,
    )
    return [Migration(entry.name.removesuffix(".sql"), entry.read_text("utf-8")) for entry in files]


@dataclass(frozen=True)
class SchemaState:
    """How the database's schema compares with the migrations this code ships."""

    missing: tuple[str, ...]  # shipped, not applied, in version order
    unknown: tuple[str, ...] = ()  # applied, not shipped: a newer release migrated it
    ledger: bool = True  # schema_migrations exists (False: never migrated)

    @property
    def current(self) -> bool:
        return not self.missing

    def describe(self) -> str:
        """What a schema that is not current lacks, in a few words."""
        if not self.ledger:
            return "no schema_migrations table: it was never migrated"
        shown = ", ".join(self.missing[:3]) + (", ..." if len(self.missing) > 3 else "")
        return f"{len(self.missing)} migration(s) missing: {shown}"


class SchemaNotCurrent(ServiceError):
    """The database is not migrated, or was migrated by an older release."""


class MigrationBusy(ServiceError):
    """Another migrate held the migration lock for longer than ``LOCK_WAIT_SECONDS``."""


async def require_current_schema(conn: Connection) -> None:
    """Raise ``SchemaNotCurrent`` (saying what is missing) unless every shipped migration
    is applied: for a process that would otherwise fail on its first delivery."""
    state = await schema_state(conn)
    if not state.current:
        raise SchemaNotCurrent(state.describe())


async def schema_state(conn: Connection) -> SchemaState:
    """Compare ``schema_migrations`` with ``load_migrations()`` (a database without the
    ledger misses every migration; a role that may not read it, those from
    ``LEDGER_READABLE_FROM`` on)."""
    shipped = [migration.version for migration in load_migrations()]
    access = await conn.fetchrow(LEDGER_ACCESS)
    if access is None or not access["present"]:
        return SchemaState(tuple(shipped), ledger=False)
    if not access["readable"]:
        return SchemaState(tuple(v for v in shipped if v >= LEDGER_READABLE_FROM))
    applied = {row["version"] for row in await conn.fetch(APPLIED_VERSIONS)}
    return SchemaState(
        tuple(v for v in shipped if v not in applied),
        tuple(sorted(applied.difference(shipped))),
    )


async def migrate(settings: Settings, *, until: str | None = None) -> list[str]:
    """Apply pending migrations (``until``: only up to that version, as an older release
    would: the tests and benchmarks of a move); return the versions applied by this call."""

    def waiting() -> None:
        log.info("migrate.waiting", extra={"for": "another migrate to finish"})

    try:
        async with holding(
            settings,
            MIGRATION_LOCK_KEY,
            wait=LOCK_WAIT_SECONDS,
            name="expiry-migrate lock",
            waiting=waiting,
        ):
            conn = await connect(settings, application_name="expiry-migrate")
            try:
                return await _apply_pending(conn, until=until)
            finally:
                await conn.close()
    except LockBusy:
        raise MigrationBusy(
            f"another migrate held the migration lock for over {LOCK_WAIT_SECONDS:g}s; "
            "run it again once that one has ended"
        ) from None


async def _apply_pending(conn: Connection, *, until: str | None = None) -> list[str]:
    await conn.execute(CREATE_LEDGER)
    applied = {row["version"] for row in await conn.fetch(APPLIED_VERSIONS)}
    done: list[str] = []
    for migration in load_migrations():
        if until is not None and migration.version > until:
            break
        if migration.version in applied:
            continue
        async with transaction(conn):
            await conn.execute(migration.sql)
            await conn.execute(RECORD_VERSION, migration.version)
        log.info("migrate.applied", extra={"version": migration.version})
        done.append(migration.version)
    return done
