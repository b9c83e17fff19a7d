"""routing/ sits below kasd and agentd: it may import wire and the support packages, never a daemon."""

from __future__ import annotations

import ast
from pathlib import Path

import routing

FORBIDDEN = ("kasd", "agentd", "kasctl", "kubesim")


def test_routing_never_imports_a_daemon() -> None:
    offenders = []
    for path in sorted(Path(routing.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {name}" for name in names if name.split(".")[0] in FORBIDDEN]
    assert offenders == []


ROOT = Path(routing.__file__).parent.parent
PRODUCT = ("routing", "kasd", "agentd", "kasctl", "wire", "tunnelhttp", "netio", "daemonkit", "h2trio", "http11")


def _public_classes(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    return [node.name for node in tree.body if isinstance(node, ast.ClassDef) and not node.name.startswith("_")]


def test_no_routing_class_shares_its_name_with_one_of_another_product_package() -> None:
    # One name, one concept: a reader (or an import) must never have to ask "which Directory?"
    ours = {name: path for path in sorted((ROOT / "routing").rglob("*.py")) for name in _public_classes(path)}
    ours |= {name: ROOT / "kasd/replicas.py" for name in _public_classes(ROOT / "kasd/replicas.py")}
    clashes = [f"{name}: {ours[name].relative_to(ROOT)} and {path.relative_to(ROOT)}"
               for package in PRODUCT for path in sorted((ROOT / package).rglob("*.py"))
               for name in _public_classes(path) if name in ours and ours[name] != path]
    assert clashes == []


def test_one_list_of_methods_safe_to_repeat() -> None:
    # The pipeline and the holder side of the hop must agree on what may be sent again.
    safe = {"GET", "HEAD", "OPTIONS"}
    places = []
    for package in ("routing", "kasd"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Set) and {getattr(e, "value", None) for e in node.elts} == safe:
                    places.append(str(path.relative_to(ROOT)))
    assert places == ["routing/retry.py"]


def test_the_replicated_router_asks_the_local_router_not_its_registry() -> None:
    # One routing loop (LocalRouter.route): the replicated router adds the peers, never a copy of it.
    source = (ROOT / "routing/router.py").read_text()
    reads = [node.attr for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Attribute)]
    assert "registry" not in reads and "route" in reads
