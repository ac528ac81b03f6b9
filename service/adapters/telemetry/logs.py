"""Log lines: JSON or text on stderr, one per event, secrets redacted, written in turns.

Which events a module logs is its own business (``logging.getLogger(__name__)``, a stable
event name, the facts in ``extra``); this module only says how a line looks and where it
goes (``setup_logging``, called once by ``service.cli.run_command``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import time
from datetime import UTC, datetime
from typing import Any

from service.core.redaction import might_hold_secret, redact

_STANDARD_ATTRS = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys() | {"message", "asctime", "taskName"}
)


def _facts(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS}


def _redacted(value: Any) -> Any:
    """``value`` with every string in it (keys too, at any depth) redacted."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {_redacted(key): _redacted(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_redacted(item) for item in value]
    return value


_JSON = json.JSONEncoder(default=str)
_REDACTING_JSON = json.JSONEncoder(default=lambda value: redact(str(value)))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, event, then the facts.

    Written for the consumer's hot path (a line per delivery): the time's
    second part is formatted once per second, the facts copied in one pass.
    """

    _second = -1
    _second_text = ""

    def format(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        if second != self._second:
            self._second = second
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        entry: dict[str, Any] = {
            "ts": f"{self._second_text}.{int(record.msecs):03d}+00:00",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS:
                entry[key] = value
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            entry["error"] = f"{type(exc).__name__}: {exc}"
        line = _JSON.encode(entry)
        # One cheap look at the whole line; the rare line that may hold a
        # secret is built again from redacted values (objects as redacted str).
        if might_hold_secret(line):
            line = _REDACTING_JSON.encode(_redacted(entry))
        return line


class TextFormatter(logging.Formatter):
    """``time level event key=value ...`` for a human at a terminal (redacted as a whole)."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created, UTC).strftime("%H:%M:%S.%f")[:-3]
        facts = " ".join(f"{k}={v}" for k, v in _facts(record).items())
        line = f"{when} {record.levelname.lower():7} {record.getMessage()} {facts}"
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            line += f" error={type(exc).__name__}: {exc}"
        return redact(line.rstrip())


class TurnHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes the lines logged in one turn of the event loop together, at its end.

    A consumer logs a line per delivery and settles hundreds in one turn: one
    write for them instead of one each. Warnings and worse, and lines logged
    outside the loop's thread, are written at once, after what waits before them.
    """

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._lines: list[str] = []
        self._scheduled = False

    def handleError(self, record: logging.LogRecord) -> None:
        """A line that could not be formatted or written: one redacted line saying so,
        never the record's raw arguments (logging's default prints them)."""
        event = record.msg if isinstance(record.msg, str) else type(record.msg).__name__
        error = sys.exc_info()[1]
        reason = type(error).__name__ if error is not None else "unknown"
        with contextlib.suppress(Exception):
            sys.stderr.write(redact(f"log line lost: {event[:100]} ({reason})") + "\n")

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:
            self.handleError(record)
            return
        self._lines.append(line)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or record.levelno >= logging.WARNING:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            loop.call_soon(self.flush)

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            self._scheduled = False
            if self._lines:
                lines, self._lines = self._lines, []
                try:
                    self.stream.write("\n".join(lines) + "\n")
                except Exception:
                    self.handleError(logging.makeLogRecord({"msg": "log write failed"}))
            super().flush()


def setup_logging(level: str, fmt: str) -> None:
    """Send log lines to stderr in the chosen format."""
    handler = TurnHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # What no line shows need not be gathered for each one (the logging HOWTO's
    # "Optimization": no caller lookup, no thread or process names).
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    root.setLevel(level)
    # Library chatter (reconnect attempts with tracebacks; httpx's line per request, which
    # names the endpoint's URL, credentials in it included) stays at WARNING.
    for noisy in ("aio_pika", "aiormq", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    # aiormq says "error when creating transport" (at ERROR) for each connect that fails,
    # which the service says itself: the one line of a refusal (a TLS failure), or
    # broker.unreachable for the node it moves on from.
    logging.getLogger("aiormq.connection").addFilter(_said_by_the_service)


def _said_by_the_service(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("error when creating transport")
