"""The demo's stack itself: what ``kasctl.stack.Stack`` hands its processes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import yaml

from kasctl.stack import Stack


def _command_line(pid: int, fallback: list[str]) -> str:
    """What `ps` shows of a process (its /proc cmdline where there is one)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return " ".join(fallback)


def test_the_cluster_token_is_kept_out_of_ps_even_when_it_begins_with_a_dash(tmp_path: Path) -> None:
    # Tokens are random URL-safe text: one in 64 starts with "-", which once made kubesim's argument
    # parser take it for an option, and the demo fail to start.
    stack = Stack(tmp_path)
    stack.cluster_token = "-" + stack.cluster_token
    try:
        stack._start_kubesim(timeout=20)
        config = yaml.safe_load((tmp_path / "cluster.kubeconfig").read_text())
        assert config["users"][0]["user"]["token"] == stack.cluster_token
        assert stack.kubesim is not None and stack.kubesim.proc is not None
        assert stack.cluster_token not in _command_line(stack.kubesim.proc.pid, stack.kubesim.args)
        token_file = tmp_path / "cluster-token"
        assert token_file.read_text() == stack.cluster_token
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    finally:
        stack.stop()


def test_no_daemon_is_killed_before_its_own_drain_bound_runs_out(tmp_path: Path) -> None:
    # Stopping the demo with a `kubectl get -w` open: agentd may drain for its shutdown_grace and kasd
    # for its shutdown_timeout; SIGKILL must come only after that. Read the bounds the way each
    # daemon does, from the very arguments and environment the stack started it with.
    from agentd.config import load_config as load_agentd_config
    from kasd.config import load_config as load_kasd_config

    stack = Stack(tmp_path)
    try:
        stack.start()
        assert stack.agentd is not None and stack.kasd is not None and stack.kubesim is not None
        agentd = load_agentd_config(stack.agentd.args[3:], stack.agentd.env or {})
        kasd = load_kasd_config(stack.kasd.args[3:], stack.kasd.env or dict(os.environ))
        assert stack.agentd.args[1:3] == ["-m", "agentd"] and stack.kasd.args[1:3] == ["-m", "kasd"]
        assert stack.agentd.stop_timeout >= agentd.shutdown_grace + 5
        assert stack.kasd.stop_timeout >= kasd.shutdown_timeout + 5
        # The defaults are the daemons' own (agentd 10 s, kasd 20 s): the demo drains as deployed.
        assert (agentd.shutdown_grace, kasd.shutdown_timeout) == (10.0, 20.0)
    finally:
        codes = stack.stop()
    assert codes == {"agentd": 0, "kasd": 0, "kubesim": 0}
