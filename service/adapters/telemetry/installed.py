"""What a command installs for watching it: tracing, and metrics for a process that
serves or pushes them, flushed and stopped at its end."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from service.adapters.telemetry.meters import setup_metrics, shutdown
from service.adapters.telemetry.tracing import setup_tracing
from service.settings import Settings


@dataclass(frozen=True)
class Telemetry:
    """What ``telemetry_for`` installed (``None``: off)."""

    tracing: TracerProvider | None
    meters: MeterProvider | None


@contextlib.contextmanager
def telemetry_for(
    settings: Settings, role: str, *, metrics: bool = False, long_lived: bool = False
) -> Iterator[Telemetry]:
    """Tracing (and metrics, for a process that serves or pushes them), flushed at the end.

    ``long_lived``: its span export process is ready before the work starts (see
    ``tracing.setup_tracing``); a short command starts at once, beside it.
    """
    installed = Telemetry(
        setup_tracing(settings, role, export_ready=long_lived),
        setup_metrics(settings, role) if metrics else None,
    )
    try:
        yield installed
    finally:
        shutdown(installed.tracing, installed.meters)
