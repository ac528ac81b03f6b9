"""The scan: one pass over the due holds (``once``: ``produce --scan``), and passes on a
timer with their metrics and health (``every``: ``produce --every``)."""

from service.scan.once import (
    CLAIM_MARGIN_SECONDS,
    Links,
    ScanResult,
    ScanStopped,
    claim_page,
    publish_batch,
    record_page,
    scan_once,
    scan_pass,
)

__all__ = [
    "CLAIM_MARGIN_SECONDS",
    "Links",
    "ScanResult",
    "ScanStopped",
    "claim_page",
    "publish_batch",
    "record_page",
    "scan_once",
    "scan_pass",
]
