"""How a delivery settled alone may end, as values (``settling.Settler`` carries them out,
``reporting.Reporter`` reports them): the failure behind it, if any, and what follows."""

from __future__ import annotations

from dataclasses import dataclass

from service.core.retry import DeadLetter, Reject, Requeue, Retry


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
class Refused:
    """The broker refused its copy (``refused``): what follows, ``core.retry.after_refusal``
    decided (back to the queue after a pause, or rejected for good)."""

    failure: Failure
    refused: str
    then: Requeue | Reject


@dataclass(frozen=True)
class Rejected:
    """Reject it for good: a bug in its handling (``why``)."""

    why: str
    failure: None = None


Ending = Copied | Refused | Rejected
