"""The session's fixtures of the deploy/kubernetes tests: the tools, and every rendering."""

from __future__ import annotations

import pytest
from ruamel.yaml import YAML

from tests.deploy.kube import Rendered, run
from tests.support import missing


@pytest.fixture(scope="session")
def tools() -> None:
    """Every tool the checks need is installed."""
    found = run("check.py", "tools")
    if found.returncode != 0:
        missing(f"deploy/kubernetes tools: {found.stdout.strip() or found.stderr.strip()}")


@pytest.fixture(scope="session")
def rendered(tools: None, tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    """Every rendering, by file name; the shipped profiles are `small` and `large`. The
    setups, each rendered from a directory named setup, are `setup`, `setup#2`, ... in
    the order check.py renders them."""
    out = tmp_path_factory.mktemp("rendered")
    done = run("check.py", "render", "--out", out)
    assert done.returncode == 0, done.stdout + done.stderr
    yaml = YAML(typ="safe")
    found: Rendered = {}
    for path in sorted(out.glob("*")):
        name = base = path.stem.partition("-")[2]
        number = 1
        while name in found:
            number += 1
            name = f"{base}#{number}"
        found[name] = [d for d in yaml.load_all(path) if d]
    return found
