"""An OTLP/HTTP trace receiver that keeps nothing: what the benchmark's traced consumers
export to, so that tracing costs what it costs the consumer, and no collector's work.

``python -m bench.sink --port-file F --out J`` listens on 127.0.0.1 (a free port, written
to F), answers every ``POST /v1/traces`` with 200, keeps the bodies, and at SIGTERM counts
the spans they hold (the protobuf parsed then, not while the consumer runs: on a small
machine the sink's CPU would be taken from the consumer) and writes
``{"requests": n, "spans": n}`` to J. A body that is not OTLP protobuf is counted as
invalid (``"invalid": n``).
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

MAX_BODY = 64 * 1024 * 1024


class Counts:
    """What the sink was sent: the bodies, counted at the end."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bodies: list[bytes] = []

    def add(self, body: bytes) -> None:
        with self.lock:
            self.bodies.append(body)

    def summary(self) -> dict[str, int]:
        """Requests, spans, and the bodies that were not OTLP protobuf."""
        spans = invalid = 0
        for body in self.bodies:
            try:
                request = ExportTraceServiceRequest.FromString(body)
            except Exception:
                invalid += 1
                continue
            spans += sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
        return {"requests": len(self.bodies), "spans": spans, "invalid": invalid}


def handler_for(counts: Counts) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a collector does

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 <= length <= MAX_BODY:
                self.send_error(413)
                return
            counts.add(self.rfile.read(length))
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: object) -> None:
            return  # one line per export would be the sink's main work

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sink", description=__doc__)
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    counts = Counts()
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(counts))
    server.daemon_threads = True

    def stop(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=server.shutdown).start()

    signal.signal(signal.SIGTERM, stop)
    args.port_file.write_text(str(server.server_address[1]))
    server.serve_forever()
    args.out.write_text(json.dumps(counts.summary()))


if __name__ == "__main__":
    main()
