"""``python -m service.migrate``: create or upgrade the schema (``adapters/postgres/schema.py``)."""

from __future__ import annotations

import argparse

from service.adapters.postgres.schema import migrate
from service.cli import run_command
from service.settings import Settings


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
