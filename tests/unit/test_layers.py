"""The folders are the architecture: imports only point down, and the core stays pure.

Read from the source (no import is run): every ``import``/``from`` of every
module under ``service/``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SERVICE = Path(__file__).resolve().parents[2] / "service"
# Lower layers first; a module may import its own layer and the layers below.
LAYERS = ["core", "settings", "adapters", "worker|ops|scan", "commands"]
IO_LIBRARIES = ("aio_pika", "aiormq", "asyncpg", "opentelemetry", "pamqp", "httpx", "h11")


def layer_of(module: str) -> int:
    """The layer of ``service.x.y`` (commands: the top-level entry points and cli)."""
    part = module.split(".")[1] if module.count(".") >= 1 else ""
    for rank, names in enumerate(LAYERS):
        if part in names.split("|"):
            return rank
    return len(LAYERS) - 1


def modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(SERVICE.rglob("*.py")):
        relative = path.relative_to(SERVICE.parent).with_suffix("")
        name = ".".join(part for part in relative.parts if part != "__init__")
        found.append((name, path))
    return found


def imports_of(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def service_imports(path: Path) -> set[str]:
    return {name for name in imports_of(path) if name.split(".")[0] == "service"}


@pytest.mark.parametrize(("module", "path"), modules(), ids=[m for m, _ in modules()])
def test_imports_point_down(module: str, path: Path) -> None:
    """No module imports from a layer above its own, nor a sibling layer of its floor."""
    own = layer_of(module)
    group = module.split(".")[1] if module.count(".") else ""
    for target in service_imports(path):
        other = layer_of(target)
        target_group = target.split(".")[1] if target.count(".") else ""
        same_floor_sibling = other == own and target_group != group and own == 3
        assert other <= own, f"{module} imports {target}, a layer above"
        assert not same_floor_sibling, f"{module} imports {target}, a sibling layer"


@pytest.mark.parametrize(
    ("module", "path"),
    [(m, p) for m, p in modules() if m.startswith("service.core")],
    ids=[m for m, _ in modules() if m.startswith("service.core")],
)
def test_the_core_imports_no_io_library(module: str, path: Path) -> None:
    """service.core imports neither aio-pika, aiormq, asyncpg, opentelemetry nor pamqp."""
    libraries = {name.split(".")[0] for name in imports_of(path)}
    assert not libraries & set(IO_LIBRARIES), f"{module} imports {libraries & set(IO_LIBRARIES)}"


def test_the_check_catches_an_upward_import(tmp_path: Path) -> None:
    """The rule itself: an adapter importing the worker is caught."""
    source = tmp_path / "x.py"
    source.write_text("from service.worker.consumer import Consumer\n")
    [target] = [t for t in service_imports(source) if t.count(".") == 2]
    assert layer_of(target) > layer_of("service.adapters.postgres")
