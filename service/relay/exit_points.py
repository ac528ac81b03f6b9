"""Test-only exit points of the relay (``EXPIRY_FAILPOINT``): a process exit at a chosen
moment, as a crash there would be.

``exit-after-publish`` exits once a batch's events were confirmed by the broker, before
they are marked sent: what a relay killed between its publish and its mark leaves (the
next claim, once the lease lapsed, publishes them again with the same message ids).
Without the setting the relay gets ``NO_EXITS``, which does nothing.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("service.relay")

EXIT_AFTER_PUBLISH = "exit-after-publish"
EXIT_CODE = 137  # as a SIGKILL


class NoExits:
    """Production: nothing happens."""

    def after_publish(self) -> None:
        """Nothing."""


class ExitAfterPublish(NoExits):
    """Exits the process (code 137) once a batch was published, before its mark."""

    def after_publish(self) -> None:
        """Exit now."""
        log.warning("relay.failpoint", extra={"failpoint": EXIT_AFTER_PUBLISH})
        logging.shutdown()
        os._exit(EXIT_CODE)


NO_EXITS = NoExits()


def exits_for(spec: str) -> NoExits:
    """The exit point ``EXPIRY_FAILPOINT`` asks for (the consumer's are not the relay's)."""
    return ExitAfterPublish() if spec.lower() == EXIT_AFTER_PUBLISH else NO_EXITS
