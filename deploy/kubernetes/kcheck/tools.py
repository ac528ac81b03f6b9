"""Where the checks' tools are, as .ci/kubernetes-checks installs them: kubectl (the
machine's, or the pinned wheel's), kubernetes-validate and checkov (each in a venv of its
own under deploy/kubernetes/.tools: checkov's pins clash with the service's), node with
validate/node_modules. A missing tool is ``Missing``, with what installs it."""

from __future__ import annotations

import atexit
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from kcheck.manifests import HERE, REPO

TOOLS = HERE / ".tools"
CACHE = HERE / ".cache"
NODE_MODULES = HERE / "validate" / "node_modules"
INSTALL = "run .ci/kubernetes-checks once (it installs the tools)"
# The Kubernetes schemas the core objects are validated against: the oldest release these
# manifests claim (docs/deployment.md, "On Kubernetes") and the newest kubernetes-validate
# 1.37.0 carries.
KUBERNETES_VERSIONS = ("1.30", "1.37")
# kustomize v5 (kubectl >= 1.27): Components, `patches` with targets, `labels`.
KUSTOMIZE_MAJOR = 5


@functools.cache
def workdir() -> Path:
    """This process's scratch folder under .cache, removed at its exit: two runs at once
    (pytest's workers, CI and a developer) never share one."""
    CACHE.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="run-", dir=CACHE))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


class Missing(Exception):
    """A tool the checks need is not installed."""


def _version_of_kustomize(kubectl: str) -> int | None:
    try:
        out = subprocess.run(
            [kubectl, "version", "--client"], capture_output=True, text=True, timeout=30
        ).stdout
    except OSError:
        return None
    found = re.search(r"Kustomize Version: v(\d+)", out)
    return int(found.group(1)) if found else None


def kubectl() -> str:
    """kubectl with kustomize v5: $K8S_CHECKS_KUBECTL, else the pinned wheel's when
    installed, else the machine's."""
    candidates = [
        os.environ.get("K8S_CHECKS_KUBECTL", ""),
        str(TOOLS / "kubectl" / "bin" / "kubectl"),
        shutil.which("kubectl") or "",
    ]
    for candidate in filter(None, candidates):
        if Path(candidate).is_file() and (_version_of_kustomize(candidate) or 0) >= KUSTOMIZE_MAJOR:
            return candidate
    raise Missing(f"no kubectl with kustomize v{KUSTOMIZE_MAJOR}: {INSTALL}")


def _venv_tool(venv: str, name: str) -> str:
    tool = TOOLS / venv / "bin" / name
    if not tool.is_file():
        raise Missing(f"{name} is not installed in {tool.parent.parent}: {INSTALL}")
    return str(tool)


def kubernetes_validate() -> str:
    """The kubernetes-validate command of its venv."""
    return _venv_tool("validate", "kubernetes-validate")


def checkov() -> str:
    """The checkov command of its venv."""
    return _venv_tool("checkov", "checkov")


def node() -> str:
    """node, with validate/node_modules installed (npm ci)."""
    found = shutil.which("node")
    if found is None:
        raise Missing("node is not installed (Node 20 or newer)")
    if not (NODE_MODULES / "@kubernetes-models" / "keda").is_dir():
        raise Missing(f"{NODE_MODULES} is missing: {INSTALL}")
    return found


def python() -> str:
    """The repository's Python (.venv): the service's commands run in it."""
    venv = REPO / ".venv" / "bin" / "python"
    return str(venv) if venv.is_file() else sys.executable


def all_present() -> list[str]:
    """What is missing, one line each (empty: every tool is there)."""
    missing = []
    for find in (kubectl, kubernetes_validate, checkov, node):
        try:
            find()
        except Missing as exc:
            missing.append(str(exc))
    return missing


def version_line(command: list[str]) -> str:
    """A tool's own version line."""
    out = subprocess.run(command, capture_output=True, text=True, timeout=60)
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[0] if text else "?"
