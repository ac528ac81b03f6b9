"""A SIGTERM that reached the process as PID 1 before it listened is honoured once it
listens (``service/pid1.py``); elsewhere nothing is installed."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from service import pid1
from service.cli import stop_on_signals


async def test_a_remembered_sigterm_stops_the_command_as_soon_as_it_listens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a SIGTERM remembered, entering ``stop_on_signals`` sets the stop event and calls
    the command's own stop at once."""
    monkeypatch.setattr(pid1, "_requested", True)
    called: list[str] = []
    with stop_on_signals(asyncio.Event(), also=lambda: called.append("also")) as stop:
        assert stop.is_set()
    assert called == ["also"]


async def test_without_one_the_command_listens_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a remembered SIGTERM the stop event waits for a signal."""
    monkeypatch.setattr(pid1, "_requested", False)
    with stop_on_signals(asyncio.Event()) as stop:
        assert not stop.is_set()
        os.kill(os.getpid(), signal.SIGTERM)
        async with asyncio.timeout(5):
            await stop.wait()


def test_the_handler_remembers_and_is_installed_only_as_pid_1(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The handler only notes the request; ``install`` leaves SIGTERM alone unless the
    process is PID 1."""
    monkeypatch.setattr(pid1, "_requested", False)
    pid1._remember(signal.SIGTERM, None)
    assert pid1.stop_requested()
    before = signal.getsignal(signal.SIGTERM)
    pid1.install()  # pytest is not PID 1
    assert signal.getsignal(signal.SIGTERM) is before
