"""``python -m service.migrate``: apply the versioned SQL migrations in order.

Each file in ``service/migrations`` runs once, in its own transaction, and is
recorded in ``schema_migrations``. A session-level advisory lock makes two
concurrent runs take turns; the second finds nothing left to do.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from importlib import resources

from service import db
from service.cli import run_command
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


@dataclass(frozen=True)
class Migration:
    """One SQL file: its version is the file name without ``.sql``."""

    version: str
    sql: str


def load_migrations() -> list[Migration]:
    """All migrations shipped with the package, in version order."""
    folder = resources.files("service").joinpath("migrations")
    files = sorted(
        (entry for entry in folder.iterdir() if entry.name.endswith(".sql")),
        key=lambda entry: entry.name,
    )
    return [Migration(entry.name.removesuffix(".sql"), entry.read_text("utf-8")) for entry in files]


async def migrate(settings: Settings) -> list[str]:
    """Apply pending migrations; return the versions applied by this call."""
    conn = await db.connect(settings, application_name="expiry-migrate")
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
        try:
            return await _apply_pending(conn)
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
    finally:
        await conn.close()


async def _apply_pending(conn: db.Connection) -> list[str]:
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


async def _main(settings: Settings, _args: argparse.Namespace) -> int:
    applied = await migrate(settings)
    print(f"schema current; applied {len(applied)} migration(s): {', '.join(applied) or 'none'}")
    return 0


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m service.migrate",
        description="Create or upgrade the schema. Safe to run again and concurrently.",
    )
    run_command(parser, _main)


if __name__ == "__main__":
    main()
