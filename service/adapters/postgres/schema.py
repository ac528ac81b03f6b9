"""Versioned schema migrations: the SQL files in ``migrations/``, each applied once.

Each file runs once, in its own transaction, and is recorded in
``schema_migrations``. A session-level advisory lock makes two concurrent runs
take turns; the second finds nothing left to do.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib import resources

from service.adapters.postgres.pool import Connection, connect
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
RECORD_VERSION = "INSERT INTO schema_migrations (version) VALUES ($1)"
LOCK = "SELECT pg_advisory_lock($1)"
UNLOCK = "SELECT pg_advisory_unlock($1)"


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


async def migrate(settings: Settings) -> list[str]:
    """Apply pending migrations; return the versions applied by this call."""
    conn = await connect(settings, application_name="expiry-migrate")
    try:
        await conn.execute(LOCK, MIGRATION_LOCK_KEY)
        try:
            return await _apply_pending(conn)
        finally:
            await conn.execute(UNLOCK, MIGRATION_LOCK_KEY)
    finally:
        await conn.close()


async def _apply_pending(conn: Connection) -> list[str]:
    await conn.execute(CREATE_LEDGER)
    applied = {row["version"] for row in await conn.fetch(APPLIED_VERSIONS)}
    done: list[str] = []
    for migration in load_migrations():
        if migration.version in applied:
            continue
        async with conn.transaction():
            await conn.execute(migration.sql)
            await conn.execute(RECORD_VERSION, migration.version)
        log.info("migrate.applied", extra={"version": migration.version})
        done.append(migration.version)
    return done
