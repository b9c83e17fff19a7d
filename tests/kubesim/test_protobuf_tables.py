"""kubesim/src/kubesim/protobuf_tables.json is what kubesim/tools/gen_protobuf_tables.py makes of kubectl.

The generator runs against every kubectl the tests find. The one whose version the file records must
reproduce it byte for byte; any other (kubectl 1.32 beside 1.37, say) must agree on every field both
have: number, JSON name and kind. Presence may differ between versions (apimachinery 1.33 made
``creationTimestamp`` omitzero), which is why the file names its kubectl.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from kubesim.protobuf_kinds import KINDS
from tests.kubesim.kubectl_harness import kubectl_binaries

REPO = Path(__file__).resolve().parents[2]
TABLES = REPO / "kubesim" / "src" / "kubesim" / "protobuf_tables.json"
KUBECTLS = kubectl_binaries()


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("gen_protobuf_tables", REPO / "kubesim" / "tools" / "gen_protobuf_tables.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not KUBECTLS, reason="no kubectl binary found")
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kubectl", [path for _, path in KUBECTLS], ids=[f"kubectl-{minor}" for minor, _ in KUBECTLS])
def test_generator_reproduces_the_checked_in_tables(kubectl: str) -> None:
    gen = _generator()
    text = TABLES.read_text()
    checked_in = json.loads(text)
    document = gen.generate(kubectl, checked_in["messages"])
    if document["kubectl"] == checked_in["kubectl"]:
        assert gen.dumps(document) == text
        return
    for name, rows in document["messages"].items():
        theirs = {row[0]: row[1:3] for row in checked_in["messages"][name]}
        for number, json_name, kind, _presence in rows:
            assert theirs[number] == [json_name, kind], (kubectl, name, number)
    # every kind kubesim accepts has its table, whatever the version
    assert set(KINDS.values()) <= set(document["messages"])
