"""The library touchpoints (``service/adapters/amqp/internals.py``): their ranges are the
declared ones and the installed releases are within them; the patches are switched on
by a command's start, only within the ranges, and never by an import."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from service.adapters.amqp import internals, wire

REPO = Path(__file__).resolve().parents[2]
# What pamqp's table decoding uses for a short string, a table and a timestamp.
DECODERS = """
from pamqp import decode
print(decode.short_str.__module__, decode.METHODS["table"].__module__,
      decode.TABLE_MAPPING[b"T"].__module__)
"""
PAMQPS_OWN = "pamqp.decode pamqp.decode pamqp.decode"
TOTAL = "service.adapters.amqp.wire service.adapters.amqp.wire service.adapters.amqp.wire"
# A command through service.cli.run_command that prints the decoders it runs with.
COMMAND = """
import argparse
from service import cli
from service.adapters.amqp import internals
{before}
async def command(settings, args):
    exec({decoders!r})
    return 0
cli.run_command(argparse.ArgumentParser(prog="python -m service.test"), command)
"""


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter (this one may have patched pamqp already)."""
    env = {**os.environ, "EXPIRY_LOG_FORMAT": "text", "EXPIRY_EVENT_LOOP": "asyncio"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )


def test_pyproject_declares_the_checked_ranges() -> None:
    """Each library with touchpoints is declared with the range they were checked on."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    for checked in internals.CHECKED:
        assert checked.requirement in project["dependencies"]


def test_the_installed_releases_are_within_the_checked_ranges() -> None:
    """Here (the lock's environment, or CI's newest releases) every patch is on."""
    assert internals.unchecked() == []
    assert internals.pages_allowed()
    assert internals.decoders_allowed()


@pytest.mark.parametrize(
    ("version", "admitted"),
    [
        ("7.2.4", True),
        ("7.2.5", True),
        ("7.2.40", True),
        ("7.2.3", False),
        ("7.2", False),
        ("7.3", False),
        ("7.3.0", False),
        ("8.0.0", False),
        ("7.2.5rc1", False),
        ("7.2.4.post1", False),
        ("7.2.4+deb1", False),
        ("", False),
        (None, False),
    ],
)
def test_a_range_admits_plain_releases_from_the_checked_one_below_the_next_minor(
    version: str | None, admitted: bool
) -> None:
    """From the checked release up to, not including, the next minor; a pre-, post- or
    local release was not checked."""
    assert internals.AIORMQ.admits(version) is admitted


def test_within_the_ranges_install_uses_the_total_decoders_silently(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The total decoders are installed, and no line is logged."""
    calls: list[str] = []
    monkeypatch.setattr(wire, "install", lambda: calls.append("install"))
    caplog.set_level(logging.DEBUG, logger=internals.__name__)
    internals.install()
    assert calls == ["install"]
    assert [r for r in caplog.records if r.name == internals.__name__] == []


def test_outside_a_range_install_keeps_pamqps_decoders_and_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """aiormq and pamqp outside their ranges: pamqp's own decoders stay, pages go one by
    one, and one warning line names both, their ranges and the effect."""
    releases = {"aio-pika": internals.AIO_PIKA.lowest, "aiormq": "7.3.0", "pamqp": "5.0.0"}
    monkeypatch.setattr(internals, "installed", releases.get)
    calls: list[str] = []
    monkeypatch.setattr(wire, "install", lambda: calls.append("install"))
    caplog.set_level(logging.DEBUG, logger=internals.__name__)
    internals.install()
    assert calls == []
    assert not internals.pages_allowed()
    (record,) = [r for r in caplog.records if r.name == internals.__name__]
    assert (record.levelno, record.getMessage()) == (logging.WARNING, "amqp.unchecked_release")
    assert record.__dict__["installed"] == "aiormq 7.3.0, pamqp 5.0.0"
    assert record.__dict__["checked"] == "aiormq>=7.2.4,<7.3, pamqp>=4.0.1,<4.1"
    assert "one by one" in record.__dict__["effect"]
    assert "pamqp's own decoders" in record.__dict__["effect"]


def test_importing_every_module_of_the_service_leaves_pamqp_alone() -> None:
    """No import patches pamqp: every module of ``service`` imported, its decoders are
    still pamqp's own."""
    walk = (
        "import importlib, pkgutil, service\n"
        "for found in pkgutil.walk_packages(service.__path__, 'service.'):\n"
        "    importlib.import_module(found.name)\n"
    )
    result = run_python(walk + DECODERS)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == PAMQPS_OWN


def test_a_command_runs_with_the_total_decoders() -> None:
    """``run_command`` installs them before the command runs, saying nothing."""
    result = run_python(COMMAND.format(before="", decoders=DECODERS))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == TOTAL
    assert "amqp.unchecked_release" not in result.stderr


def test_a_command_on_unchecked_releases_starts_with_one_warning_line() -> None:
    """Every library outside its range: the command runs on pamqp's decoders, after one
    warning line at its start."""
    before = "internals.installed = lambda _name: '99.0'"
    result = run_python(COMMAND.format(before=before, decoders=DECODERS))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == PAMQPS_OWN
    lines = [line for line in result.stderr.splitlines() if "amqp.unchecked_release" in line]
    assert len(lines) == 1, result.stderr
    assert "warning" in lines[0]
    assert "aiormq 99.0" in lines[0]
