"""The image's containers, driven through the ``docker`` command line as a user drives them.

Every container runs as the image's own user on a read-only root filesystem with the
host's network (the only network a registry-less CI engine has, and where the test
run's PostgreSQL and RabbitMQ listen). Settings go in through an env file, not the
command line. Every container this run made is removed at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import RUN_ID, missing

# The image under test (built by .ci/image, or by hand: docs/development.md).
IMAGE = os.environ.get("SERVICE_IMAGE", "")
# The client: Debian's docker.io where .ci/image installed it, else the one on PATH.
DOCKER = os.environ.get("DOCKER") or shutil.which("docker") or "docker"
LABEL = f"expiry-test-run={RUN_ID}"

_counter = itertools.count(1)


def image_or_skip() -> str:
    """The image to test; skip (fail under CI) when none is named or no engine answers."""
    if not IMAGE:
        missing("SERVICE_IMAGE names no image (build one: .ci/image, or docker build)")
    probe = subprocess.run(
        [DOCKER, "image", "inspect", IMAGE], capture_output=True, check=False, timeout=60
    )
    if probe.returncode != 0:
        missing(f"the Docker engine does not answer or has no image {IMAGE}")
    return IMAGE


@dataclass(frozen=True)
class Finished:
    """How a container ended."""

    exit_code: int
    output: str
    seconds: float  # from the stop (or the start, for a one-off run) to its end


async def docker(*args: str, timeout: float = 120) -> tuple[int, str]:
    """Run ``docker args``; its exit code and output (stdout then stderr)."""
    process = await asyncio.create_subprocess_exec(
        DOCKER,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(timeout):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, (out + err).decode(errors="replace")


async def docker_ok(*args: str, timeout: float = 120) -> str:
    """``docker(args)``, which must succeed; its output."""
    code, output = await docker(*args, timeout=timeout)
    assert code == 0, f"docker {' '.join(args[:2])} exited {code}: {output[-2000:]}"
    return output


# runc freezes a container's cgroup and gives up ("unable to freeze") when a task of it
# does not stop within its own short wait (one in the kernel at that moment): the
# container is left running, as it was; another try a moment later succeeds.
FREEZE_TRIES = 5


async def docker_pause(container: str) -> None:
    """``docker pause``, tried again while runc could not freeze the container in time."""
    for attempt in range(1, FREEZE_TRIES + 1):
        code, output = await docker("pause", container)
        if code == 0:
            return
        if "unable to freeze" not in output or attempt == FREEZE_TRIES:
            raise AssertionError(f"docker pause exited {code}: {output[-2000:]}")
        await asyncio.sleep(0.5 * attempt)


@dataclass
class Containers:
    """This test's containers of ``image``; ``env_dir`` holds their env files."""

    image: str
    env_dir: Path
    names: list[str] = field(default_factory=list)

    def _env_file(self, name: str, env: Mapping[str, str]) -> Path:
        path = self.env_dir / f"{name}.env"
        path.write_text("".join(f"{key}={value}\n" for key, value in env.items()))
        path.chmod(0o600)
        return path

    def _run_args(self, name: str, env: Mapping[str, str], extra: tuple[str, ...]) -> list[str]:
        return [
            "--name",
            name,
            "--label",
            LABEL,
            "--network",
            "host",
            "--read-only",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "--env-file",
            str(self._env_file(name, env)),
            *extra,
            self.image,
        ]

    def name(self, role: str) -> str:
        """A new container name for ``role``, unique to this run."""
        return f"expiry-test-{RUN_ID}-{next(_counter)}-{role}"

    async def run(
        self, role: str, command: list[str], env: Mapping[str, str], *, timeout: float = 180
    ) -> Finished:
        """Run ``command`` in a new container to its end."""
        name = self.name(role)
        self.names.append(name)
        started = time.monotonic()
        code, output = await docker(
            "run", *self._run_args(name, env, ()), *command, timeout=timeout
        )
        return Finished(code, output, time.monotonic() - started)

    async def start(
        self, role: str, command: list[str], env: Mapping[str, str], *extra: str
    ) -> str:
        """Start ``command`` in a new, detached container; its name."""
        name = self.name(role)
        self.names.append(name)
        await docker_ok("run", "--detach", *self._run_args(name, env, extra), *command)
        return name

    async def inspect(self, name: str) -> dict[str, Any]:
        """``docker inspect`` of one container."""
        found: list[dict[str, Any]] = json.loads(await docker_ok("inspect", name))
        return found[0]

    async def inspect_image(self) -> dict[str, Any]:
        """``docker image inspect`` of the image."""
        found: list[dict[str, Any]] = json.loads(await docker_ok("image", "inspect", self.image))
        return found[0]

    async def health(self, name: str) -> str:
        """The container's health: starting, healthy or unhealthy (or its state, if none)."""
        state = (await self.inspect(name))["State"]
        if not state["Running"]:
            return f"exited {state['ExitCode']}"
        return str(state.get("Health", {}).get("Status", "no health check"))

    async def wait_healthy(self, name: str, timeout: float = 90) -> float:
        """Wait until the image's health check passes in ``name``; the seconds it took."""
        started = time.monotonic()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while (status := await self.health(name)) != "healthy":
                    if status.startswith("exited") or status == "unhealthy":
                        break
                    await asyncio.sleep(0.5)
        status = await self.health(name)
        assert status == "healthy", f"{name} is {status}: {await self.logs(name)}"
        return time.monotonic() - started

    async def stop(self, name: str, grace: float) -> Finished:
        """``docker stop`` with ``grace`` seconds before SIGKILL; how it ended."""
        started = time.monotonic()
        await docker_ok("stop", "--time", str(int(grace)), name, timeout=grace + 60)
        seconds = time.monotonic() - started
        state = (await self.inspect(name))["State"]
        return Finished(int(state["ExitCode"]), await self.logs(name), seconds)

    async def wait_catching_sigterm(self, name: str, timeout: float = 30) -> None:
        """Wait until the container's first process catches SIGTERM (bit 15 of the
        ``SigCgt`` mask in /proc/PID/status, read from the host)."""
        pid = int((await self.inspect(name))["State"]["Pid"])
        async with asyncio.timeout(timeout):
            while not _catches_sigterm(pid):
                await asyncio.sleep(0.005)

    async def wait_for_output(self, name: str, text: str, timeout: float = 60) -> None:
        """Wait until the container has written ``text``."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while text not in await self.logs(name):
                    await asyncio.sleep(0.3)
        assert text in (output := await self.logs(name)), f"{name} never wrote {text!r}: {output}"

    async def logs(self, name: str) -> str:
        """What the container wrote (its last 200 lines)."""
        _, output = await docker("logs", "--tail", "200", name)
        return output

    async def remove_all(self) -> None:
        """Remove every container this run made (running or not)."""
        code, listed = await docker("ps", "--all", "--quiet", "--filter", f"label={LABEL}")
        ids = listed.split() if code == 0 else []
        if ids:
            await docker("rm", "--force", "--volumes", *ids)


def _catches_sigterm(pid: int) -> bool:
    """Whether process ``pid`` has a handler for SIGTERM (its ``SigCgt`` mask)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


@contextlib.asynccontextmanager
async def containers_of(image: str, env_dir: Path) -> AsyncIterator[Containers]:
    """``Containers`` of ``image``, all removed when the block ends."""
    made = Containers(image, env_dir)
    try:
        yield made
    finally:
        await made.remove_all()
