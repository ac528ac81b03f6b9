"""The shared ``main()``: arguments, settings, the event loop and the exit code.

Only this module catches broadly: a failure becomes one line on stderr and a
non-zero exit; the cause chain and the traceback only with ``--verbose``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import signal
import sys
import traceback
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, Protocol, TypeVar

from prometheus_client.registry import CollectorRegistry

from service import pid1
from service.adapters.amqp import internals
from service.adapters.classify import schema_missing
from service.adapters.telemetry import prometheus_registry, setup_logging, telemetry_for
from service.core.errors import ConfigError, UsageError
from service.core.redaction import redact
from service.settings import Settings, load_settings

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
EXIT_FAILURE = 1
EXIT_CONFIG = 2
EXIT_NOT_MIGRATED = 5  # a table or column is missing: run the migrations
MIGRATE_COMMAND = "python -m service.migrate"

Number = TypeVar("Number", int, float)
Command = Callable[[Settings, argparse.Namespace], Coroutine[Any, Any, int]]


def cause_chain(exc: BaseException) -> list[str]:
    """``Type: message`` for the exception and each cause, redacted."""
    lines: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current).strip().splitlines()[0] if str(current).strip() else ""
        lines.append(
            redact(f"{type(current).__name__}: {text}" if text else type(current).__name__)
        )
        current = current.__cause__ or current.__context__
    return lines


@contextlib.contextmanager
def stop_on_signals(
    stop: asyncio.Event, *, also: Callable[[], None] | None = None
) -> Iterator[asyncio.Event]:
    """SIGTERM and SIGINT set ``stop`` (and call ``also``) until the block ends; so does a
    SIGTERM that reached the process as PID 1 before (``service/pid1.py``)."""
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        stop.set()
        if also is not None:
            also()

    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, on_signal)
    if pid1.stop_requested():
        on_signal()
    try:
        yield stop
    finally:
        for signum in STOP_SIGNALS:
            loop.remove_signal_handler(signum)


def within(
    kind: Callable[[str], Number], low: float, high: float, what: str = "a number"
) -> Callable[[str], Number]:
    """An argparse type: ``kind`` (``int``, ``float``) of the text, from ``low`` to ``high``
    (``high`` may be infinite: no upper bound)."""

    def parse(text: str) -> Number:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        if not low <= value <= high:  # NaN fails too
            bound = f"must be >= {low:g}" if high == math.inf else f"from {low:g} to {high:g}"
            raise argparse.ArgumentTypeError(bound)
        return value

    return parse


def positive(kind: Callable[[str], Number], what: str = "a number") -> Callable[[str], Number]:
    """An argparse type: ``kind`` (``int``, ``float``) of the text, greater than zero."""
    at_least = within(kind, 0, math.inf, what)

    def parse(text: str) -> Number:
        value = at_least(text)
        if value <= 0:
            raise argparse.ArgumentTypeError("must be > 0")
        return value

    return parse


positive_seconds = positive(float, "a number of seconds")


def invoked_as(prog: str) -> str:
    """The name a user typed: a console script's (``expiry-consume``), else ``prog``
    (``python -m service.consume``)."""
    name = os.path.basename(sys.argv[0]) if sys.argv else ""
    return name if name.startswith("expiry-") else prog


VERBOSE_HELP = "print the cause chain and the traceback on failure"


def common_options() -> argparse.ArgumentParser:
    """The options every subcommand takes too (its ``parents``): ``--verbose``, after the
    subcommand as well as before it."""
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a subcommand without it keeps what was given before the subcommand.
    common.add_argument(
        "--verbose", action="store_true", default=argparse.SUPPRESS, help=VERBOSE_HELP
    )
    return common


def run_command(parser: argparse.ArgumentParser, command: Command) -> None:
    """Parse arguments, load settings, install the library patches
    (``service/adapters/amqp/internals.py``), run ``command`` and exit with its code."""
    parser.prog = invoked_as(parser.prog)
    parser.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    args = parser.parse_args()
    try:
        settings = load_settings()
    except ConfigError as exc:
        print(f"{parser.prog}: configuration error: {redact(str(exc))}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    setup_logging(settings.log_level, settings.log_format)
    internals.install()  # the library patches the installed releases allow
    try:
        with asyncio.Runner(loop_factory=loop_factory(settings.event_loop)) as runner:
            code: int = runner.run(command(settings, args))
    except KeyboardInterrupt:
        code = 130
    except UsageError as exc:
        print(f"{parser.prog}: refused: {redact(str(exc))}", file=sys.stderr)
        code = EXIT_CONFIG
    except ConfigError as exc:  # found on the way: a server's TLS refused (TlsRefused)
        print(f"{parser.prog}: configuration error: {redact(str(exc))}", file=sys.stderr)
        code = EXIT_CONFIG
    except Exception as exc:
        code = report_failure(parser.prog, exc, verbose=args.verbose)
    sys.exit(code)


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop ``EXPIRY_EVENT_LOOP`` asks for: uvloop's (``auto``: when it is
    installed), or ``None`` for asyncio's own."""
    if choice == "asyncio":
        return None
    try:
        import uvloop  # optional: the uvloop extra
    except ImportError:
        if choice == "uvloop":  # settings refuse this at start; a broken install lands here
            raise
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def report_failure(prog: str, exc: BaseException, *, verbose: bool) -> int:
    """One redacted line on stderr (with ``verbose`` the cause chain and the traceback
    too); the exit code: EXIT_NOT_MIGRATED when a table or column is missing, else
    EXIT_FAILURE."""
    chain = cause_chain(exc)
    missing = schema_missing(exc)
    if missing is not None:
        print(
            f"{prog}: the database is not migrated, or by an older release ({redact(missing)}): "
            f"run {MIGRATE_COMMAND}",
            file=sys.stderr,
        )
    else:
        print(f"{prog}: failed: {chain[0]}", file=sys.stderr)
    if verbose:
        for line in chain[1:]:
            print(f"  caused by {line}", file=sys.stderr)
        sys.stderr.write(redact("".join(traceback.format_exception(exc))))
    return EXIT_FAILURE if missing is None else EXIT_NOT_MIGRATED


class _Closing(Protocol):
    def close(self) -> None: ...


M = TypeVar("M", bound=_Closing)


async def serve_until_stopped(
    settings: Settings,
    role: str,
    metrics_for: Callable[[CollectorRegistry | None], M],
    work: Callable[[asyncio.Event, M], Awaitable[object]],
) -> int:
    """A long-lived process's body: ``work`` until SIGTERM or SIGINT sets its event, with
    its telemetry (its span export ready first) and its metrics (shown where a scrape
    reads them, and taken back out at the end); 0 once ``work`` returns."""
    with (
        stop_on_signals(asyncio.Event()) as stop,
        telemetry_for(settings, role, metrics=True, long_lived=True),
    ):
        metrics = metrics_for(prometheus_registry(settings))
        try:
            await work(stop, metrics)
        finally:
            metrics.close()
    return 0
