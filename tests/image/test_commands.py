"""What the image is: its user, its default command and health check, a read-only root it
never writes to, and every command compose.yaml gives it, accepted."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from tests.image.containers import Containers
from tests.image.world import FIGURES
from tests.support import REPO

pytestmark = pytest.mark.image

# compose.yaml's services built from this repository's Dockerfile.
COMPOSE_IMAGE = "expiry-service:local"


def compose_commands(path: Path = REPO / "compose.yaml") -> dict[str, list[str]]:
    """Each of the image's compose services: the command line it runs (entrypoint, command)."""
    loaded: dict[str, Any] = YAML(typ="safe").load(path.read_text())
    commands: dict[str, list[str]] = {}
    for name, service in loaded["services"].items():
        if service.get("image") != COMPOSE_IMAGE:
            continue
        entrypoint = service.get("entrypoint") or []
        command = service.get("command") or []
        assert isinstance(entrypoint, list), f"{name}: entrypoint as a list, not a shell string"
        assert isinstance(command, list), f"{name}: command as a list, not a shell string"
        commands[name] = [str(word) for word in [*entrypoint, *command]]
    return commands


def test_compose_names_the_image_for_every_service_of_the_service() -> None:
    """compose.yaml's services that run the service (migrate, declare, the consumers, the
    scanner, retention, the console, the operator, the demo) all use the one image."""
    names = set(compose_commands())
    assert {"migrate", "declare", "consumer", "scanner", "retention", "console"} <= names


async def test_the_image_runs_as_its_own_user_with_its_health_check(
    containers: Containers,
) -> None:
    """The image runs as uid 10001 by default, consumes by default, checks its health with
    ``python -m service.healthcheck``, and works on a read-only root it cannot write."""
    config = (await containers.inspect_image())["Config"]
    assert config["User"] == "10001:10001"
    assert config["Cmd"] == ["python", "-m", "service.consume"]
    assert config["Healthcheck"]["Test"][:4] == ["CMD", "python", "-m", "service.healthcheck"]
    assert config["StopSignal"] == "SIGTERM"
    probe = await containers.run(
        "probe",
        [
            "python",
            "-c",
            "import os, sys\n"
            "print(os.getuid(), os.getgid())\n"
            "for path in ('/app/x', '/opt/venv/x', '/x'):\n"
            "    try:\n"
            "        open(path, 'w')\n"
            "        sys.exit(f'wrote {path}')\n"
            "    except OSError:\n"
            "        pass\n",
        ],
        {},
    )
    assert probe.exit_code == 0, probe.output
    assert probe.output.split() == ["10001", "10001"]


async def test_every_command_compose_gives_the_image_is_one_it_has(
    containers: Containers,
) -> None:
    """Each compose service's command line (and the image's health check), with ``--help``
    added, is accepted by the image: the module exists and takes those arguments."""
    commands = compose_commands()
    commands["HEALTHCHECK"] = ["python", "-m", "service.healthcheck", "--timeout", "5"]
    limit = asyncio.Semaphore(4)

    async def accepted(name: str, command: list[str]) -> tuple[str, int, str]:
        async with limit:
            done = await containers.run(f"help-{name}", [*command, "--help"], {})
        return name, done.exit_code, done.output

    results = await asyncio.gather(*(accepted(n, c) for n, c in commands.items()))
    refused = {name: output[-500:] for name, code, output in results if code != 0}
    assert not refused, f"the image refused: {refused}"
    FIGURES.append(
        f"compose commands the image accepts (--help, exit 0): {len(results)}: "
        + ", ".join(sorted(commands))
    )
