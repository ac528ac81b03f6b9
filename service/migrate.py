"""``python -m service.migrate``: create or upgrade the schema (``adapters/postgres/schema.py``),
and register the webhook endpoints of ``EXPIRY_WEBHOOKS`` when it is given one: a
deployment whose setup step migrates before anything expires then writes a delivery for
every expiry to each of them, whichever process starts first (docs/webhooks.md)."""

from __future__ import annotations

import argparse

from service.adapters import postgres
from service.adapters.postgres import webhook_endpoints
from service.adapters.postgres.schema import migrate
from service.cli import run_command
from service.settings import Settings


async def _main(settings: Settings, _args: argparse.Namespace) -> int:
    applied = await migrate(settings)
    print(f"schema current; applied {len(applied)} migration(s): {', '.join(applied) or 'none'}")
    if settings.webhooks:
        names = [endpoint.name for endpoint in settings.webhooks]
        async with postgres.connected(settings, name="expiry-migrate") as conn:
            await webhook_endpoints.register(conn, names)
        print(
            f"webhook endpoints registered: {', '.join(names)} (a delivery is written for "
            "each expiry from now on)"
        )
    return 0


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m service.migrate",
        description="Create or upgrade the schema, and register the webhook endpoints of "
        "EXPIRY_WEBHOOKS when given. Safe to run again and concurrently.",
    )
    run_command(parser, _main)


if __name__ == "__main__":
    main()
