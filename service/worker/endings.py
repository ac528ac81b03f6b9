"""How a delivery settled alone may end, as values (``settling.Settler`` carries them out,
``reporting.Reporter`` reports them): the failure behind it, if any, and what follows."""

from __future__ import annotations

from dataclasses import dataclass

from service.core.retry import DeadLetter, Retry


@dataclass(frozen=True)
class Failure:
    """What went wrong with a delivery, and what follows it (``core.retry.decide``)."""

    exc: BaseException
    error_class: str
    reason: str  # safe to show: ``delivery.short_reason``
    decision: Retry | DeadLetter


@dataclass(frozen=True)
class Copied:
    """Its retry or dead-letter copy is confirmed: ack the original."""

    failure: Failure


@dataclass(frozen=True)
class Requeued:
    """The broker refused its copy: return it to the queue (after the pause)."""

    failure: Failure
    refused: str


@dataclass(frozen=True)
class Rejected:
    """Reject it for good (a bug in its handling, or a copy refused too often)."""

    why: str
    failure: Failure | None = None  # its failure, when its copy was refused
    refused: str | None = None


Ending = Copied | Requeued | Rejected
