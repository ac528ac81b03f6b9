"""What the tests of deploy/kubernetes share: running its scripts, reading and writing
rendered objects, finding one, running one check over objects."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from tests.support import REPO

TREE = REPO / "deploy" / "kubernetes"
Obj = dict[str, Any]
Rendered = dict[str, list[Obj]]


def run(script: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    """``python deploy/kubernetes/SCRIPT ARGS`` from the repository root."""
    return subprocess.run(
        [sys.executable, str(TREE / script), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
        check=False,
    )


def write(path: Path, objects: list[Obj]) -> Path:
    """Objects as one YAML stream."""
    with path.open("w", encoding="utf-8") as out:
        YAML(typ="safe", pure=True).dump_all(objects, out)
    return path


def the(objects: list[Obj], kind: str, name: str) -> Obj:
    """The object of that kind and name."""
    for obj in objects:
        if obj.get("kind") == kind and obj["metadata"]["name"] == name:
            return obj
    raise AssertionError(f"no {kind}/{name}")


def find(objects: list[Obj], kind: str, name: str) -> Obj:
    """A deep copy of the object of that kind and name (the test may break it)."""
    return copy.deepcopy(the(objects, kind, name))


def check(name: str, tmp_path: Path, objects: list[Obj]) -> subprocess.CompletedProcess[str]:
    """One check of check.py over these objects."""
    return run("check.py", name, write(tmp_path / "objects.yaml", objects))


def failures(done: subprocess.CompletedProcess[str]) -> str:
    """The problem lines a check printed."""
    return "\n".join(line for line in done.stdout.splitlines() if "FAIL " in line)


def settings_map(objects: list[Obj]) -> Obj:
    """The settings ConfigMap (expiry-settings-HASH) of a rendering."""
    named = [o for o in objects if o["metadata"]["name"].startswith("expiry-settings-")]
    maps = [o for o in named if o["kind"] == "ConfigMap"]
    assert len(maps) == 1, [o["metadata"]["name"] for o in maps]
    return maps[0]


def settings_of(objects: list[Obj]) -> dict[str, Any]:
    """The settings of a rendering's ConfigMap."""
    return dict(settings_map(objects)["data"])
