"""The previous release beside the current one (a rollout): the code of a commit, taken
from git into a directory of its own with a virtual environment of its own runtime
dependencies (its hash-pinned ``requirements/runtime.txt``, installed by uv), and its
commands started from there as subprocesses.

The checkout's ``service`` package is the old one because the command runs with the old
tree as its working directory (``python -m`` puts it first on ``sys.path``) in a venv
where no release of the service is installed; ``OldRelease.check`` proves it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tests.support import REPO

UV = Path(sys.executable).parent / "uv"
SETUP_TIMEOUT_SECONDS = 600.0


@dataclass(frozen=True)
class OldRelease:
    """A commit's tree (``root``: ``service``, ``pyproject.toml``, ``requirements``) and
    the python of its venv; ``built_in``: seconds the tree and the venv took to make."""

    commit: str
    root: Path
    python: Path
    built_in: float

    def check(self) -> Path:
        """The file ``import service`` loads when a command runs from ``root``."""
        found = subprocess.run(
            [str(self.python), "-c", "import service; print(service.__file__)"],
            cwd=self.root,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return Path(found.stdout.strip())


def clean_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (else this process's) without what would lead another python to this
    checkout's code or this venv's packages."""
    base = dict(os.environ if env is None else env)
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT"):
        base.pop(name, None)
    return base


def build_old_release(commit: str, where: Path) -> OldRelease:
    """``commit``'s tree under ``where/old`` and a venv of its runtime lock in
    ``where/venv`` (uv, no project configuration read); raises ``RuntimeError`` saying what
    failed."""
    if shutil.which(str(UV)) is None:
        raise RuntimeError(f"uv is not installed at {UV}")
    started = time.monotonic()
    root, venv = where / "old", where / "venv"
    root.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit, "service", "pyproject.toml", "requirements"],
        capture_output=True,
        check=False,
        timeout=120,
    )
    if archive.returncode != 0:
        raise RuntimeError(f"git archive {commit}: {archive.stderr.decode(errors='replace')}")
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True, timeout=120)
    lock = root / "requirements" / "runtime.txt"
    if not lock.is_file():
        raise RuntimeError(f"{commit} has no requirements/runtime.txt")
    env = clean_env() | {"UV_NO_CONFIG": "1"}
    python = venv / "bin" / "python"
    for command in (
        [str(UV), "venv", "--quiet", str(venv), "--python", sys.executable],
        [
            str(UV),
            "pip",
            "install",
            "--quiet",
            "--python",
            str(python),
            "--require-hashes",
            "-r",
            str(lock),
        ],
    ):
        done = subprocess.run(
            command,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=SETUP_TIMEOUT_SECONDS,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command[:3])}: {done.stderr.strip()[-2000:]}")
    return OldRelease(commit, root, python, time.monotonic() - started)


@dataclass(eq=False)
class Running:
    """A command started in the background, its output (stdout and stderr) to a file."""

    name: str
    process: asyncio.subprocess.Process
    log: IO[bytes]

    def output(self) -> str:
        """What it has written so far."""
        self.log.flush()
        with open(self.log.fileno(), "rb", closefd=False) as reader:
            reader.seek(0)
            return reader.read().decode(errors="replace")

    async def stop(self, sig: int = signal.SIGTERM, *, timeout: float = 60) -> int:
        """Signal it and wait for its exit code (the log stays readable)."""
        if self.process.returncode is None:
            self.process.send_signal(sig)
        async with asyncio.timeout(timeout):
            return await self.process.wait()

    def close(self) -> None:
        """Kill it if it still runs, and close its log."""
        if self.process.returncode is None:
            self.process.kill()
        self.log.close()


async def start(
    name: str, python: Path, cwd: Path, module: str, *args: str, env: dict[str, str]
) -> Running:
    """``python -m module args`` from ``cwd``, in the background."""
    log = tempfile.TemporaryFile()  # noqa: SIM115 (closed by Running.close)
    process = await asyncio.create_subprocess_exec(
        str(python), "-m", module, *args, env=env, cwd=cwd, stdout=log, stderr=log
    )
    return Running(name, process, log)
