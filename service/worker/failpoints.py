"""Test-only failpoints (``EXPIRY_FAILPOINT``): a process exit at a chosen moment.

``exit-after-commit`` exits right after the first commit, before its ack, as a
crash there would; ``exit-on:<reservation uuid>`` exits whenever that
reservation's command is handled, like a message that kills every consumer
that takes it. Without the setting the consumer gets ``NO_FAILPOINTS``, which
does nothing.
"""

from __future__ import annotations

import logging
import os
from typing import Protocol
from uuid import UUID

log = logging.getLogger("service.consume")

EXIT_AFTER_COMMIT = "exit-after-commit"
EXIT_ON = "exit-on:"
EXIT_CODE = 137


class Failpoints(Protocol):
    """The moments a test may choose to crash the consumer at."""

    def on_handling(self, reservation_id: UUID) -> None:
        """A command for ``reservation_id`` is about to be handled."""

    def after_commit(self) -> None:
        """A guarded update committed; its ack is not sent yet."""


class NoFailpoints:
    """Production: nothing happens."""

    def on_handling(self, reservation_id: UUID) -> None:
        """Nothing."""

    def after_commit(self) -> None:
        """Nothing."""


class ExitFailpoints:
    """Exits the process (code 137, as a SIGKILL) at the chosen moment."""

    def __init__(self, spec: str) -> None:
        self.spec = spec.lower()

    def on_handling(self, reservation_id: UUID) -> None:
        """Exit if this is the chosen reservation."""
        self._exit_if(f"{EXIT_ON}{reservation_id}")

    def after_commit(self) -> None:
        """Exit if the chosen moment is after a commit."""
        self._exit_if(EXIT_AFTER_COMMIT)

    def _exit_if(self, name: str) -> None:
        if self.spec == name:
            log.warning("expiry.failpoint", extra={"failpoint": self.spec})
            logging.shutdown()
            os._exit(EXIT_CODE)


NO_FAILPOINTS = NoFailpoints()


def failpoints_for(spec: str) -> Failpoints:
    """The failpoints ``EXPIRY_FAILPOINT`` asks for (none when empty)."""
    return ExitFailpoints(spec) if spec else NO_FAILPOINTS
