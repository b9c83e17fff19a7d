"""The demo's stack itself: what ``kasctl.stack.Stack`` hands its processes."""

from __future__ import annotations

from pathlib import Path

import yaml

from kasctl.stack import Stack


def test_the_cluster_starts_with_a_token_that_begins_with_a_dash(tmp_path: Path) -> None:
    # Tokens are random URL-safe text: one in 64 starts with "-", which once made kubesim's argument
    # parser take it for an option, and the demo fail to start.
    stack = Stack(tmp_path)
    stack.cluster_token = "-" + stack.cluster_token
    try:
        stack._start_kubesim(timeout=20)
        config = yaml.safe_load((tmp_path / "cluster.kubeconfig").read_text())
        assert config["users"][0]["user"]["token"] == stack.cluster_token
    finally:
        stack.stop()
