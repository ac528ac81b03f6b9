"""The event loop a command runs on (``EXPIRY_EVENT_LOOP``, ``service.cli``)."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import sys

import pytest

from service import cli
from service.core.errors import ConfigError
from service.settings import Settings, load_settings


def _run(monkeypatch: pytest.MonkeyPatch, choice: str | None) -> str:
    """Run a command through ``run_command`` and return its running loop's module."""
    if choice is None:
        monkeypatch.delenv("EXPIRY_EVENT_LOOP", raising=False)
    else:
        monkeypatch.setenv("EXPIRY_EVENT_LOOP", choice)
    monkeypatch.setattr("sys.argv", ["python -m service.test"])
    seen: list[str] = []

    async def command(_settings: Settings, _args: argparse.Namespace) -> int:
        seen.append(type(asyncio.get_running_loop()).__module__)
        return 0

    with pytest.raises(SystemExit) as exited:
        cli.run_command(argparse.ArgumentParser(prog="python -m service.test"), command)
    assert exited.value.code == 0
    return seen[0]


def test_auto_runs_on_uvloop_where_it_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default (``auto``) takes uvloop when it is installed, as in the image."""
    pytest.importorskip("uvloop")
    assert _run(monkeypatch, None).startswith("uvloop")
    assert _run(monkeypatch, "uvloop").startswith("uvloop")


def test_asyncio_runs_on_asyncios_own_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """``asyncio`` keeps the standard library's loop, uvloop installed or not."""
    assert _run(monkeypatch, "asyncio").startswith("asyncio")


def test_auto_without_uvloop_is_asyncio(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without uvloop, ``auto`` gives no factory (asyncio's own loop); ``uvloop`` fails."""
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    assert cli.loop_factory("auto") is None
    assert cli.loop_factory("asyncio") is None
    with pytest.raises(ImportError):
        cli.loop_factory("uvloop")


def test_uvloop_asked_for_but_missing_stops_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """``EXPIRY_EVENT_LOOP=uvloop`` without uvloop installed: one line naming the setting."""
    monkeypatch.setenv("EXPIRY_EVENT_LOOP", "uvloop")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "uvloop" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"^EXPIRY_EVENT_LOOP: uvloop is not installed"):
        load_settings()
