"""The kubectl battery through each of three replicas, for an agent whose one tunnel is on one of
them (its home, where kasd's placement put it): get, list, watch, logs -f, exec with stdin,
port-forward and a 5 MiB object work the same through every replica; on the other two they cross
exactly one hop."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from kasctl.stack import Stack
from tests.cluster.conftest import KUBECTLS, LineReader, kubectl_at, metric


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.args, result.stdout[-2000:], result.stderr[-2000:])
    return result.stdout


def _port_forward_echo(binary: str, stack: Stack, replica: int, namespace: str, pod: str) -> None:
    """`kubectl port-forward` to the pod's echo port (7) and one round trip through it."""
    forward = LineReader([binary, "--kubeconfig", str(stack.kubeconfig), "--context", stack.context_of(replica),
                          "-n", namespace, "port-forward", f"pod/{pod}", ":7", "--address", "127.0.0.1"])
    try:
        line = forward.wait_for("Forwarding from 127.0.0.1:")
        match = re.search(r"127\.0\.0\.1:(\d+) -> 7", line)
        assert match, line
        with socket.create_connection(("127.0.0.1", int(match.group(1))), timeout=10) as conn:
            conn.sendall(b"across the hop\n")
            got = b""
            while not got.endswith(b"\n"):
                chunk = conn.recv(4096)
                assert chunk, got
                got += chunk
        assert got == b"across the hop\n"
    finally:
        forward.stop()


REPLICAS = pytest.mark.parametrize("replica", [0, 1, 2], ids=["kasd-1", "kasd-2", "kasd-3"])


@REPLICAS
def test_the_kubectl_battery_through_each_replica(three: Stack, kubectl_bin: str, replica: int,
                                                  tmp_path: Path) -> None:
    battery(three, kubectl_bin, replica, tmp_path)


@REPLICAS
def test_the_battery_with_a_redis_cluster(three_on_cluster: Stack, replica: int, tmp_path: Path) -> None:
    battery(three_on_cluster, KUBECTLS[-1][1], replica, tmp_path)


def holder(stack: Stack) -> int:
    """The one replica holding agentd's tunnel (placement settled: one tunnel in all)."""
    deadline = time.monotonic() + 10
    while True:
        held = [metric(stack, i, "kasd_agent_sessions") for i in range(stack.replicas)]
        if sum(held) == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert sum(held) == 1, held
    return held.index(1)


def battery(three: Stack, kubectl_bin: str, replica: int, tmp_path: Path) -> None:
    where = holder(three)
    holds = where == replica
    forwarded_before = metric(three, replica, 'kasd_forwarded_requests_total{direction="out"}')
    ns = f"r{replica}-k{abs(hash(kubectl_bin)) % 10_000}"

    def k(*args: str, stdin: str | None = None) -> str:
        return _ok(kubectl_at(kubectl_bin, three, replica, "-n", ns, *args, stdin=stdin))

    _ok(kubectl_at(kubectl_bin, three, replica, "create", "namespace", ns))
    # get and list
    assert ns in _ok(kubectl_at(kubectl_bin, three, replica, "get", "namespaces"))
    k("create", "configmap", "first", "--from-literal=a=1")
    assert "first" in k("get", "configmaps")
    # watch: open, then a change made through another replica shows up
    watch = LineReader([kubectl_bin, "--kubeconfig", str(three.kubeconfig), "--context", three.context_of(replica),
                        "-n", ns, "get", "configmaps", "-w"])
    try:
        watch.wait_for("first")
        _ok(kubectl_at(kubectl_bin, three, (replica + 1) % 3, "-n", ns, "create", "configmap", "second"))
        watch.wait_for("second")
    finally:
        watch.stop()
    # a pod for logs -f, exec and port-forward
    k("run", "box", "--image=busybox")
    k("wait", "--for=condition=Ready", "pod/box", "--timeout=15s")
    logs = LineReader([kubectl_bin, "--kubeconfig", str(three.kubeconfig), "--context", three.context_of(replica),
                       "-n", ns, "logs", "-f", "box"])
    try:
        logs.wait_for("ready")
        assert logs.proc.poll() is None  # still following
    finally:
        logs.stop()
    payload = "through one hop\n" * 2000
    assert k("exec", "-i", "box", "--", "cat", stdin=payload) == payload
    _port_forward_echo(kubectl_bin, three, replica, ns, "box")
    # a 5 MiB object, streamed both ways
    blob = os.urandom(5 * 1024 * 1024 // 2).hex()
    manifest = tmp_path / "big.yaml"
    manifest.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big"},
                                        "data": {"blob": blob}}))
    assert "created" in k("create", "-f", str(manifest))
    assert k("get", "configmap", "big", "-o", "jsonpath={.data.blob}") == blob

    forwarded = metric(three, replica, 'kasd_forwarded_requests_total{direction="out"}') - forwarded_before
    assert holder(three) == where  # the tunnel stayed put
    if holds:
        assert forwarded == 0  # the holder serves from its own tunnel
    else:
        assert forwarded >= 10  # every request above crossed the hop to the holder
