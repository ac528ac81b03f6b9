"""The folders are the architecture: every import obeys one rule table, and the core stays pure.

Read from the source (no module is imported): every ``import`` and ``from`` of every
module under ``service/``, those inside functions and relative ones included, is
checked against ``MAY_IMPORT``.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

SERVICE = Path(__file__).resolve().parents[2] / "service"

# The one rule: the layers each layer may import besides its own. A module's layer is
# its folder under service/; the modules beside the folders are "commands", except those
# in TOP_LEVEL_LAYERS. A new folder is a new layer: it must be added here.
MAY_IMPORT: dict[str, frozenset[str]] = {
    "core": frozenset(),
    "settings": frozenset({"core"}),
    "adapters": frozenset({"core", "settings"}),
    "worker": frozenset({"core", "settings", "adapters"}),
    "ops": frozenset({"core", "settings", "adapters"}),
    "scan": frozenset({"core", "settings", "adapters"}),
    # The relay's runtime, like scan's; its entry point (__main__) starts it with service.cli.
    "relay": frozenset({"core", "settings", "adapters", "commands"}),
    # The deliverer's (HTTP delivery of the events), likewise.
    "deliver": frozenset({"core", "settings", "adapters", "commands"}),
    "commands": frozenset({"core", "settings", "adapters", "worker", "ops", "scan"}),
    "console": frozenset({"core", "settings", "adapters", "ops", "commands"}),
    "demo": frozenset({"core", "settings", "adapters", "worker", "commands"}),
}
TOP_LEVEL_LAYERS = {"settings": "settings"}
# What service.core may import besides itself: the standard library and these.
CORE_MAY_USE = frozenset({"pydantic"})


@dataclass(frozen=True)
class Module:
    """One module of the tree: its dotted name, its file, the package it sits in."""

    name: str
    path: Path
    package: str


def modules_of(root: Path) -> list[Module]:
    """Every module under ``root`` (a package directory), named from ``root``'s own name."""
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            name = ".".join(parts[:-1])
            found.append(Module(name, path, name))
        else:
            found.append(Module(".".join(parts), path, ".".join(parts[:-1])))
    return found


def _absolute(module: Module, node: ast.ImportFrom) -> str:
    """The module a ``from`` import reads from, relative levels resolved."""
    if node.level == 0:
        return node.module or ""
    base = module.package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports_of(module: Module) -> set[str]:
    """The dotted names ``module`` imports (``from a import b`` gives ``a`` and ``a.b``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(module.path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, node)
            names.add(source)
            names.update(f"{source}.{alias.name}" for alias in node.names)
    return names


def layer_of(name: str, root: Path) -> str:
    """The layer of the dotted name ``name`` within the package at ``root``."""
    parts = name.split(".")
    if len(parts) == 1:
        return "commands"
    if (root / parts[1]).is_dir():
        return parts[1]
    return TOP_LEVEL_LAYERS.get(parts[1], "commands")


def layer_violations(module: Module, root: Path) -> list[str]:
    """Each import of ``module`` that the rule table does not allow, as a sentence."""
    own = layer_of(module.name, root)
    if own not in MAY_IMPORT:
        return [f"{module.name} is in {own!r}, a layer MAY_IMPORT does not name"]
    problems = []
    for name in sorted(imports_of(module)):
        if name.split(".")[0] != root.name:
            continue
        target = layer_of(name, root)
        if target != own and target not in MAY_IMPORT[own]:
            problems.append(f"{module.name} ({own}) imports {name} ({target})")
    return problems


def outside_libraries(module: Module, root: Path) -> set[str]:
    """The top-level packages ``module`` imports that are neither the standard library,
    ``CORE_MAY_USE`` nor ``root``'s own."""
    tops = {name.split(".")[0] for name in imports_of(module)}
    return tops - set(sys.stdlib_module_names) - CORE_MAY_USE - {root.name}


def _reachable(layer: str) -> set[str]:
    """Every layer ``layer`` may reach through the table, directly or through others."""
    seen: set[str] = set()
    todo = list(MAY_IMPORT.get(layer, ()))
    while todo:
        step = todo.pop()
        if step not in seen:
            seen.add(step)
            todo.extend(MAY_IMPORT.get(step, ()))
    return seen


MODULES = modules_of(SERVICE)
CORE = [m for m in MODULES if layer_of(m.name, SERVICE) == "core"]


def test_the_rule_table_points_one_way() -> None:
    """No layer may reach itself through the table: the layers form a strict order."""
    assert not [layer for layer in MAY_IMPORT if layer in _reachable(layer)]


def test_every_folder_is_a_layer_of_the_table_and_every_layer_is_there() -> None:
    """Each package under service/ is named in MAY_IMPORT, and each layer named exists."""
    folders = {p.parent.name for p in SERVICE.glob("*/__init__.py")}
    present = folders | {"commands"} | set(TOP_LEVEL_LAYERS.values())
    assert folders <= set(MAY_IMPORT), folders - set(MAY_IMPORT)
    named = set(MAY_IMPORT).union(*MAY_IMPORT.values())
    assert named <= present, named - present


@pytest.mark.parametrize("module", MODULES, ids=[m.name for m in MODULES])
def test_imports_follow_the_rule_table(module: Module) -> None:
    """Every service import of the module is of its own layer or one MAY_IMPORT allows."""
    assert not layer_violations(module, SERVICE)


@pytest.mark.parametrize("module", CORE, ids=[m.name for m in CORE])
def test_the_core_imports_only_the_standard_library_and_pydantic(module: Module) -> None:
    """service.core imports no library but the standard library and pydantic (no
    aio-pika, aiormq, asyncpg, opentelemetry, ...)."""
    assert not outside_libraries(module, SERVICE)


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    """A small ``service`` tree whose core imports upwards in three ways, and an I/O library."""
    root = tmp_path / "service"
    for package in ("", "core", "worker", "adapters"):
        (root / package).mkdir(exist_ok=True)
        (root / package / "__init__.py").write_text("")
    (root / "cli.py").write_text("")
    (root / "core" / "bad.py").write_text(
        "import asyncpg\n"
        "from ..worker import consumer\n"
        "def late() -> None:\n"
        "    from service import cli\n"
    )
    (root / "worker" / "consumer.py").write_text("from service.core import bad\n")
    (root / "adapters" / "fine.py").write_text("from service.core.bad import late\n")
    return root


def test_the_check_names_each_import_against_the_table(planted: Path) -> None:
    """Planted upward imports (relative, and inside a function) are each reported;
    downward ones are not."""
    found = {m.name: layer_violations(m, planted) for m in modules_of(planted)}
    assert found["service.core.bad"] == [
        "service.core.bad (core) imports service (commands)",
        "service.core.bad (core) imports service.cli (commands)",
        "service.core.bad (core) imports service.worker (worker)",
        "service.core.bad (core) imports service.worker.consumer (worker)",
    ]
    assert found["service.worker.consumer"] == []
    assert found["service.adapters.fine"] == []


def test_the_purity_check_names_an_io_library(planted: Path) -> None:
    """A core module importing asyncpg is impure; one importing nothing outside is not."""
    found = {m.name: outside_libraries(m, planted) for m in modules_of(planted)}
    assert found["service.core.bad"] == {"asyncpg"}
    assert found["service.worker.consumer"] == set()


def test_no_two_modules_share_a_name() -> None:
    """One name per thing: a module's name says which one, whatever its folder
    (``__init__`` and ``__main__`` apart)."""
    stems = Counter(
        path.stem for path in SERVICE.rglob("*.py") if path.stem not in {"__init__", "__main__"}
    )
    assert [stem for stem, count in stems.items() if count > 1] == []
