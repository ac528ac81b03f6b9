"""The span export child: ``python -m service.adapters.telemetry.span_child``.

It reads the resource, then each batch of spans its parent writes down the pipe on its
stdin (``span_wire``), rebuilds them and exports them with the standard
``OTLPSpanExporter`` (the ``OTEL_EXPORTER_OTLP_*`` variables it was given). It says it is
ready (a byte on its stdout) once its exporter is made, ignores SIGINT and SIGTERM, and
ends when the pipe closes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits

from service.adapters.telemetry.span_wire import READY, read_frame, span_from_fields


def _say_ready() -> None:
    """Write ``READY`` on stdout, then point stdout at /dev/null (it is the parent's
    pipe, which a parent that does not wait never reads)."""
    with contextlib.suppress(OSError):  # a parent that closed it does not wait
        os.write(1, READY)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


def main() -> None:
    """The child: rebuild each batch the parent sends and export it over OTLP."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    stream = sys.stdin.buffer
    first = read_frame(stream)
    if first is None:
        return
    resource = Resource(first["resource"], first["schema_url"])
    exporter = OTLPSpanExporter()
    limits = SpanLimits()  # the OTEL_SPAN_* and OTEL_ATTRIBUTE_* limits it was given
    _say_ready()
    try:
        while (batch := read_frame(stream)) is not None:
            exporter.export([span_from_fields(fields, resource, limits) for fields in batch])
    finally:
        exporter.shutdown()  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    main()
