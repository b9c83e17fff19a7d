"""docs/architecture.md's package diagram is the code's: ``scripts/import_graph.py`` reads every
product module's imports, and this fails when an import adds, or drops, an arrow the page does not
show. The fix is to run the command named in the diagram and paste its output into the page (and,
if the new arrow breaks a stated direction, to remove the import instead)."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parent.parent


def _import_graph() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_architecture_diagrams_are_the_import_graph() -> None:
    """Each mermaid block of the page names the command that draws it; it must draw the same."""
    graph = _import_graph()
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```mermaid\n(.*?)```", page, re.S)
    drawn = {re.search(r"%% (python scripts/import_graph\.py.*)", block).group(1): block  # type: ignore[union-attr]
             for block in blocks}
    measured = {"python scripts/import_graph.py": graph.mermaid(),
                "python scripts/import_graph.py --inside kasd": graph.inside("kasd")}
    assert set(drawn) == set(measured), "docs/architecture.md should show the package graph and kasd's inside"
    for command, text in measured.items():
        assert drawn[command] == text, (
            f"docs/architecture.md's diagram is not the code's import graph; `{command}` prints:\n{text}")


def test_the_graph_draws_every_package_of_the_wheel() -> None:
    """A package added to the wheel (pyproject.toml) is drawn too: the script's list is the wheel's."""
    wheel = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    packages = {pattern.rstrip("*") for pattern in wheel["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert set(_import_graph().PRODUCT) == packages
