"""What one demo run does, from the command line."""

from __future__ import annotations

import argparse
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from service.cli import within

DEFAULT_HOLDS = 3000
DEFAULT_CONSUMERS = 3
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


@dataclass(frozen=True)
class Plan:
    """What this run does (from the command line)."""

    holds: int
    consumers: int
    lead: float  # seconds until the first deadline
    spread: float  # deadlines spread over this many seconds after that
    support_share: float  # share of holds the support side consumes at their deadline
    scan_every: float
    timeout: float  # after the last deadline, how long to wait for every hold to end
    keep: bool
    name: str  # of the database and of the vhost


def plan_from(args: argparse.Namespace) -> Plan:
    """The plan the parsed command line asks for (a fresh name unless ``--name``)."""
    return Plan(
        holds=args.holds,
        consumers=args.consumers,
        lead=1.0,
        spread=args.spread,
        support_share=args.support_share,
        scan_every=args.scan_every,
        timeout=args.timeout,
        keep=args.keep,
        name=args.name or f"expiry_demo_{secrets.token_hex(4)}",
    )


def _name(text: str) -> str:
    if not NAME_PATTERN.match(text):
        raise argparse.ArgumentTypeError("lower-case letters, digits and _, starting with a letter")
    return text


@dataclass(frozen=True)
class Number:
    """A numeric option: its bounds, its default, its help (``{}`` shows the default)."""

    flag: str
    kind: Callable[[str], Any]
    low: float
    high: float
    default: float
    help: str
    metavar: str | None = None  # None: argparse's, from the flag


NUMBERS = (
    Number("--holds", int, 1, 1_000_000, DEFAULT_HOLDS, "holds to place (default {})"),
    Number("--consumers", int, 1, 32, DEFAULT_CONSUMERS, "consumer processes (default {})"),
    Number(
        "--spread",
        float,
        0,
        3600,
        5.0,
        "deadlines spread over this many seconds, from 1 s on (default {:g})",
        "SECONDS",
    ),
    Number(
        "--support-share",
        float,
        0,
        1,
        0.1,
        "share of holds consumed by the support side at their deadline (default {:g})",
        "SHARE",
    ),
    Number("--scan-every", float, 0.05, 60, 0.5, "scan interval (default {:g})", "SECONDS"),
    Number(
        "--timeout",
        float,
        1,
        3600,
        120.0,
        "after the last deadline, wait at most this long (default {:g})",
        "SECONDS",
    ),
)


def parser() -> argparse.ArgumentParser:
    """The command line."""
    result = argparse.ArgumentParser(
        prog="python -m service.demo",
        description=(
            "Run the service against a new database and vhost of its own: migrate, several "
            "consumers, the scan on a timer; place holds due over the next seconds, consume "
            "some at their deadline, watch them end, and check that each ended in exactly one "
            "state. Removes what it created unless --keep. Exit 0 only if every check passed."
        ),
    )
    for number in NUMBERS:
        result.add_argument(
            number.flag,
            type=within(number.kind, number.low, number.high),
            default=number.default,
            metavar=number.metavar,
            help=number.help.format(number.default),
        )
    result.add_argument(
        "--keep",
        action="store_true",
        help="keep the database, the vhost and the logs for inspection",
    )
    result.add_argument(
        "--name",
        type=_name,
        help="name of the database and the vhost (default expiry_demo_<random>)",
    )
    return result
