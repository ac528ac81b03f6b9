"""Entry point of ``python -m service.demo``."""

from __future__ import annotations

from service.cli import run_command
from service.demo.plan import parser
from service.demo.run import demo


def main() -> None:
    """Parse the command line, run the demo, exit with its code."""
    run_command(parser(), demo)


if __name__ == "__main__":
    main()
