"""One concept, one name: no public class name is defined twice across the product packages, so a
reader (and an import) never has to ask which ``Directory`` or ``Grant`` is meant. kubesim and the
tests are not product code and may reuse names."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parent.parent
PRODUCT_PACKAGES = ("wire", "netio", "http11", "tunnelhttp", "h2trio", "daemonkit", "routing", "kasd", "agentd",
                    "kasctl")


def public_classes(package: Path) -> dict[str, list[str]]:
    """Each public class name defined at the top of a module of ``package`` → where (path:line)."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(package.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8"), str(path)).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                found[node.name].append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_the_walk_sees_the_product() -> None:
    names = public_classes(ROOT / "kasd")
    assert "Grant" in names and "Snapshot" in names  # (a walk that found nothing would pass below)


def test_no_public_class_name_is_defined_twice() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for package in PRODUCT_PACKAGES:
        assert (ROOT / package).is_dir(), package
        for name, places in public_classes(ROOT / package).items():
            where[name] += places
    twice = {name: places for name, places in where.items() if len(places) > 1}
    assert not twice, "one concept, one name: rename or merge " + "; ".join(
        f"{name} ({', '.join(places)})" for name, places in sorted(twice.items()))
