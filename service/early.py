"""What must be checked before the OpenTelemetry libraries are imported.

They read some ``OTEL_*`` variables as they are imported (``OTEL_PROPAGATORS``, the
span limits) and raise, with a traceback quoting the value, before any command could
load its settings. So, as ``service`` is imported and only when an ``OTEL_*`` variable
is set, every one is checked as ``load_settings`` checks it (``service/settings/
otel_variables.py``); a bad one stops the process with the one line any bad setting
gets, and exit 2.
"""

from __future__ import annotations

import os
import sys

EXIT_CONFIG = 2


def check_otel_environment() -> None:
    """Exit 2 with one line naming the first bad ``OTEL_*`` variable (else return)."""
    if not any(name.startswith("OTEL_") for name in os.environ):
        return
    from service.settings.otel_variables import otel_problem

    problem = otel_problem()
    if problem is not None:
        print(f"{_prog()}: configuration error: {problem}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_CONFIG)


def _prog() -> str:
    """The command as it was started (``python -m service.consume``, ``expiry-consume``)."""
    words = list(getattr(sys, "orig_argv", []))
    if "-m" in words[:-1]:
        return f"python -m {words[words.index('-m') + 1]}"
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "expiry-service"
