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
