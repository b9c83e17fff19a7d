"""kubesim's modules import one another without a circle.

A circle hides which module is the lower one, and Python resolves it only by import order; one
held together by `if TYPE_CHECKING:` or by an import inside a function is still a circle of
dependencies. So every import counts here: module level, under TYPE_CHECKING, inside a function.
The fix for a circle is to move what both sides need into a module of its own (as `cluster.Cluster`
is for the controllers) or to invert a dependency with a small Protocol (as `netsim.Containers`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(10)

SOURCE = Path(__file__).resolve().parents[2] / "kubesim" / "src" / "kubesim"


def module_graph(root: Path, package: str = "kubesim") -> dict[str, set[str]]:
    """Each module of the package under `root` → the package's modules it imports, by any import."""
    files: dict[str, Path] = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join([package, *parts])] = path
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = here[: len(here) - node.level + 1] if node.level else []
                source = ".".join([*base, *([node.module] if node.module else [])])
                # `from kubesim import shell` imports the module kubesim.shell.
                imported.add(source)
                imported.update(f"{source}.{alias.name}" for alias in node.names)
        graph[module] = {name for name in imported if name in files and name != module}
    return graph


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle (its modules in order, the first repeated at the end), or None."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(module: str) -> list[str] | None:
        path.append(module)
        on_path.add(module)
        for target in sorted(graph[module]):
            if target in on_path:
                return [*path[path.index(target):], target]
            if target not in done and (circle := visit(target)) is not None:
                return circle
        on_path.discard(path.pop())
        done.add(module)
        return None

    for module in sorted(graph):
        if module not in done and (circle := visit(module)) is not None:
            return circle
    return None


def test_kubesim_has_no_import_circle() -> None:
    graph = module_graph(SOURCE)
    assert "kubesim.controllers" in graph and "kubesim.shell" in graph  # the walk found the package
    circle = find_circle(graph)
    assert circle is None, "kubesim imports in a circle: " + " -> ".join(circle or [])


def test_the_walk_sees_every_kind_of_import(tmp_path: Path) -> None:
    """A circle closed under TYPE_CHECKING, or by an import inside a function, is found too."""
    package = tmp_path / "kubesim"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                  "    from kubesim.b import B\n")
    (package / "b.py").write_text("def f():\n    from . import c\n")
    (package / "c.py").write_text("import kubesim.a\n")
    assert find_circle(module_graph(package)) == ["kubesim.a", "kubesim.b", "kubesim.c", "kubesim.a"]
