"""The house's sizes: modules and classes against the bounds the team keeps (no module
over 400 lines, no class over 150), in ``service/``, ``bench/`` and the Kubernetes
checks; and, where the structure tool ``duplicates`` is installed, its count of
near-copy pairs over the tree.

    python -m tests.house            # the largest modules and classes, what is over, the pairs

``tests/unit/test_house.py`` holds the bounds.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("service", "bench", "deploy/kubernetes/kcheck", "deploy/kubernetes")
MODULE_LIMIT = 400
CLASS_LIMIT = 150
SKIPPED = (".tools", "node_modules", ".cache", "__pycache__")


@dataclass(frozen=True)
class Size:
    """A module or a class, and its lines."""

    where: str
    lines: int


def modules() -> list[Path]:
    """Every Python module of the measured folders (not a folder's tools or caches)."""
    found: set[Path] = set()
    for root in ROOTS:
        for path in (REPO / root).glob("**/*.py" if root != "deploy/kubernetes" else "*.py"):
            if not any(part in SKIPPED for part in path.parts):
                found.add(path)
    return sorted(found)


def module_sizes() -> list[Size]:
    """Each module's lines, largest first."""
    sizes = [Size(str(p.relative_to(REPO)), len(p.read_text().splitlines())) for p in modules()]
    return sorted(sizes, key=lambda size: -size.lines)


def class_sizes() -> list[Size]:
    """Each class's lines (its decorators to its last line), largest first."""
    sizes = []
    for path in modules():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                where = f"{path.relative_to(REPO)}:{node.name}"
                sizes.append(Size(where, node.end_lineno - first + 1))
    return sorted(sizes, key=lambda size: -size.lines)


def near_copy_pairs() -> int | None:
    """The pairs ``duplicates`` counts over the repository (None where it is not installed)."""
    tool = shutil.which("duplicates")
    if tool is None:
        return None
    done = subprocess.run(
        [tool, "--seconds", "120"], cwd=REPO, capture_output=True, text=True, check=False
    )
    found = re.match(r"(\d+) pairs? of places", done.stdout)
    return int(found.group(1)) if found else 0 if done.stdout.startswith("no duplicates") else None


def main() -> int:
    """Print the largest modules and classes and the pairs; exit 1 if a bound is broken."""
    over = 0
    for title, sizes, limit in (
        ("modules", module_sizes(), MODULE_LIMIT),
        ("classes", class_sizes(), CLASS_LIMIT),
    ):
        print(f"{title} (bound {limit} lines), the largest:")
        for size in sizes[:8]:
            print(f"  {size.lines:5d}  {size.where}{'  OVER' if size.lines > limit else ''}")
        over += sum(size.lines > limit for size in sizes)
    pairs = near_copy_pairs()
    print(f"near-copy pairs (duplicates): {'not installed here' if pairs is None else pairs}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
