"""Logging setup (and, later, tracing): the only place providers are configured."""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import Any

_STANDARD_ATTRS = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", (), None)).keys() | {"message", "asctime", "taskName"}
)
_URL_PASSWORD = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/@\s]*):[^@/\s]*@", re.I)


def redact(text: str) -> str:
    """Replace any password embedded in a URL within ``text`` with ``***``."""
    return _URL_PASSWORD.sub(r"\g<scheme>\g<user>:***@", text)


def _facts(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, event, then the facts."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": redact(record.getMessage()),
        }
        entry.update(_facts(record))
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            entry["error"] = redact(f"{type(exc).__name__}: {exc}")
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """``time level event key=value ...`` for a human at a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created, UTC).strftime("%H:%M:%S.%f")[:-3]
        facts = " ".join(f"{k}={v}" for k, v in _facts(record).items())
        line = f"{when} {record.levelname.lower():7} {redact(record.getMessage())} {facts}"
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            line += redact(f" error={type(exc).__name__}: {exc}")
        return line.rstrip()


def setup_logging(level: str, fmt: str) -> None:
    """Send log lines to stderr in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Library chatter (reconnect attempts with tracebacks) stays at WARNING.
    for noisy in ("aio_pika", "aiormq"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
