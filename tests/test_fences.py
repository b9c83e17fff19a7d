"""Library internals stay behind their fences (STYLE.md convention 9).

A product module may use a private name of a library (``h2.connection.H2Connection._data_to_send``,
``from yaml._yaml import …``) only in a fence: one module that says what it relies on, with the
checked versions pinned as upper bounds, a test naming each assumption, and ``KASD_SAFE_MODE`` to
turn it off. Today there is one, ``h2trio/lean.py`` (``netio/fastio.py`` relies on trio's
behaviour through its public API only). This walks every product module's syntax tree and fails on
a private module or name of a library reached anywhere else, and on any use of hypercorn, which the
product no longer runs on (kasd's REST API port is kasd's own HTTP/1.1, ``kasd/asgiport.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("wire", "netio", "http11", "tunnelhttp", "h2trio", "daemonkit", "routing", "kasd", "agentd", "kasctl")
FIRST_PARTY = set(PRODUCT) | {"kubesim", "tests", "bench"}

#: the fences, and what each may reach into
FENCES = {"h2trio/lean.py": {"h2", "hyperframe"}}
#: private names the Python documentation itself tells users to set (the logging HOWTO's
#: "Optimization" table): not an internal in the sense of a fence
DOCUMENTED = {("logging", "_srcfile")}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _library(module: str) -> str | None:
    top = module.split(".")[0]
    return None if not top or top in FIRST_PARTY else top


def _reaches(tree: ast.Module) -> list[tuple[int, str, str]]:
    """(line, library, what) for each private module or name of a library the module reaches."""
    found: list[tuple[int, str, str]] = []
    aliases: dict[str, str] = {}  # local name → the library module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                library = _library(alias.name)
                if library is None:
                    continue
                if any(_private(part) for part in alias.name.split(".")):
                    found.append((node.lineno, library, alias.name))
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    aliases[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            library = _library(node.module)
            if library is None:
                continue
            if any(_private(part) for part in node.module.split(".")):
                found.append((node.lineno, library, node.module))
            for alias in node.names:
                if _private(alias.name):
                    found.append((node.lineno, library, f"{node.module}.{alias.name}"))
                else:
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    typing_only = {id(inner) for annotation in _annotations(tree) for inner in ast.walk(annotation)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and id(node) not in typing_only:
            dotted = _dotted(node.value)
            if dotted is None:
                continue
            head, _, rest = dotted.partition(".")
            if head not in aliases:
                continue
            module = aliases[head] + (f".{rest}" if rest else "")
            library = _library(module)
            if library is not None and (library, node.attr) not in DOCUMENTED:
                found.append((node.lineno, library, f"{module}.{node.attr}"))
    return found


def _annotations(tree: ast.Module) -> list[ast.expr]:
    """Every annotation: a private class named there (``argparse._SubParsersAction``) is a type the
    stubs spell, not an internal the code leans on at run time."""
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            found.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            found.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            found.append(node.annotation)
    return found


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


def _product_modules() -> list[Path]:
    return sorted(p for package in PRODUCT for p in (ROOT / package).rglob("*.py"))


def test_library_internals_are_reached_only_from_their_fence() -> None:
    outside = []
    for path in _product_modules():
        relative = path.relative_to(ROOT).as_posix()
        allowed = FENCES.get(relative, set())
        for line, library, what in _reaches(ast.parse(path.read_text(), str(path))):
            if library not in allowed:
                outside.append(f"{relative}:{line}: {what}")
    assert outside == [], "a library internal outside a fence (STYLE.md §9): " + "; ".join(outside)


def test_the_fence_itself_is_seen() -> None:
    """The walk finds what the fence does (else the test above would pass for nothing)."""
    lean = _reaches(ast.parse((ROOT / "h2trio/lean.py").read_text()))
    assert "hyperframe" in {library for _, library, _ in lean}  # (h2's are reached through subclasses)
    assert any(what.endswith("DataFrame._body_repr") for _, _, what in lean)
    assert _reaches(ast.parse("from yaml._yaml import CParser\nimport trio\ntrio._core.x = 1\n")) == [
        (1, "yaml", "yaml._yaml"), (3, "trio", "trio._core"),
    ]


def test_no_product_module_imports_hypercorn() -> None:
    users = [
        f"{path.relative_to(ROOT).as_posix()}:{node.lineno}"
        for path in _product_modules()
        for node in ast.walk(ast.parse(path.read_text()))
        if (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "hypercorn" for a in node.names))
        or (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "hypercorn")
    ]
    assert users == []
