#!/usr/bin/env python3
"""The product's import graph, read from the code: which package imports which.

    python scripts/import_graph.py              # the mermaid graph docs/architecture.md shows
    python scripts/import_graph.py --inside kasd  # kasd's modules, each subpackage one node
    python scripts/import_graph.py --modules P  # each module of package P and what it imports

It parses every ``.py`` file of the product packages (never runs them) and keeps the imports of
first-party modules, including those under ``if TYPE_CHECKING:`` (an arrow a reader must follow is
an arrow, whether or not it runs). ``tests/test_architecture_graph.py`` fails when a diagram in
``docs/architecture.md`` and this script's output disagree, so the picture cannot drift from the code.
Standard library only, so it runs without the project's environment.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the product packages, in the order the diagram lists them (top of the layers first)
PRODUCT = (
    "kasctl",
    "kasd",
    "agentd",
    "routing",
    "tunnelhttp",
    "http11",
    "wire",
    "h2trio",
    "daemonkit",
    "netio",
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def product_modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[module_name(path)] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The first-party modules ``name`` imports (a ``from p import m`` of a submodule names ``p.m``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                targets.add(sub if sub in known else source)
    found: set[str] = set()
    for target in targets:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)
    return found


def module_graph() -> dict[str, set[str]]:
    modules = product_modules()
    known = set(modules)
    return {name: imports_of(name, path, known) for name, path in modules.items()}


def package_graph() -> dict[str, set[str]]:
    arrows: dict[str, set[str]] = defaultdict(set)
    for source, targets in module_graph().items():
        top = source.split(".")[0]
        for target in targets:
            if target.split(".")[0] != top:
                arrows[top].add(target.split(".")[0])
    return arrows


def mermaid() -> str:
    """The package graph, as the page shows it (its first line says how to make it again)."""
    arrows = package_graph()
    lines = ["graph TD", "  %% python scripts/import_graph.py"]
    for source in PRODUCT:
        lines.extend(
            f"  {source} --> {target}"
            for target in sorted(arrows.get(source, ()), key=PRODUCT.index)
        )
    return "\n".join(lines) + "\n"


#: the modules that put a package together and so import nearly all of it: left out of its inside
COMPOSERS = ("__main__", "server")


def inside(package: str) -> str:
    """``package``'s own modules and the arrows between them, each subpackage drawn as one node,
    without its composition roots (``COMPOSERS``)."""
    def node(module: str) -> str | None:
        parts = module.split(".")
        if parts[0] != package or len(parts) == 1:
            return None
        if len(parts) == 2 and parts[1] in COMPOSERS:
            return None
        sub = ROOT.joinpath(*parts[:2])
        return ".".join(parts[:2]) + ("/" if sub.is_dir() else "")

    arrows: set[tuple[str, str]] = set()
    for source, targets in module_graph().items():
        a = node(source)
        for target in targets:
            b = node(target)
            if a and b and a != b:
                arrows.add((a, b))
    left_out = ", ".join(f"{package}.{name}" for name in COMPOSERS)
    lines = ["graph LR", f"  %% python scripts/import_graph.py --inside {package}",
             f"  %% left out: {left_out} (they import nearly everything to put it together)"]
    lines.extend(f"  {_id(a)}[\"{a}\"] --> {_id(b)}[\"{b}\"]" for a, b in sorted(arrows))
    return "\n".join(lines) + "\n"


def _id(name: str) -> str:
    return name.replace(".", "_").replace("/", "_pkg")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", metavar="PACKAGE", help="list each module of PACKAGE and its imports")
    parser.add_argument("--inside", metavar="PACKAGE", help="the mermaid graph of PACKAGE's own modules")
    args = parser.parse_args(argv)
    if args.modules:
        for name, targets in sorted(module_graph().items()):
            if name == args.modules or name.startswith(args.modules + "."):
                print(f"{name}: {', '.join(sorted(targets)) or '-'}")
        return 0
    sys.stdout.write(inside(args.inside) if args.inside else mermaid())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
