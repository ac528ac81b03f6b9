"""SIGTERM for a container's first process, from the moment the package is imported.

The kernel drops a signal that PID 1 has no handler for, and Python installs none for
SIGTERM: a ``docker stop`` or a pod's deletion in the first moments of a command, before
it installs its own handlers (``service.cli.stop_on_signals``), would be lost, and the
process killed at the end of its grace period. As PID 1 only, a handler is installed when
``service`` is imported; it remembers the request, and ``stop_on_signals`` honours it as
soon as the command listens (a consumer then stops cleanly, exit 0). A command that never
listens (migrate, declare) finishes its work. Anywhere else SIGTERM keeps its default
action: the process ends at once.
"""

from __future__ import annotations

import os
import signal
from types import FrameType

_requested = False


def _remember(_signum: int, _frame: FrameType | None) -> None:
    global _requested  # one flag, set from a signal handler
    _requested = True


def install() -> None:
    """Remember a SIGTERM that reaches this process as PID 1 (else do nothing)."""
    if os.getpid() == 1:
        signal.signal(signal.SIGTERM, _remember)


def stop_requested() -> bool:
    """Whether SIGTERM reached this process before it listened for it."""
    return _requested
