"""bench/regression.py: its arguments, and how it makes one tree's stack start the other tree's
kubesim (the part that breaks when kubesim's or the stack's command line changes). A whole run
starts four stacks per round; the figures it printed are in docs/benchmarks.md."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import regression  # noqa: E402

pytestmark = pytest.mark.timeout(30)


class _Stack:
    def _python(self, module: str, *args: str) -> list[str]:
        return ["python", "-m", module, *args]


def test_an_rbac_kubesim_gets_the_demo_binding_and_other_processes_are_left_alone(tmp_path: Path) -> None:
    stack = _Stack()
    regression._fit_kubesim_args(stack, tmp_path)  # this tree's kubesim has RBAC
    argv = stack._python("kubesim", "--port", "0")
    assert argv[-2:] == ["--manifest", str(tmp_path / "cluster-rbac.yaml")]
    binding = (tmp_path / "cluster-rbac.yaml").read_text()
    assert "gitlab:project:1" in binding and "gitlab:project:group/demo" in binding  # new and old job identities
    given = stack._python("kubesim", "--manifest", "/x.yaml")
    assert given.count("--manifest") == 1 and given[-1] == "/x.yaml"  # a stack that passes its own keeps it
    assert stack._python("kasd", "--config", "k.yaml") == ["python", "-m", "kasd", "--config", "k.yaml"]


def test_without_an_old_tree_it_says_what_it_needs() -> None:
    result = subprocess.run([sys.executable, "bench/regression.py"], capture_output=True, text=True,
                            timeout=25, cwd=REPO)  # fmt: skip
    assert result.returncode == 2 and "--old is required" in result.stderr
