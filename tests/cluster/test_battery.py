"""The kubectl battery through each of three replicas, for an agent whose one tunnel is on one of
them (its home, where kasd's placement put it): get, list, watch, logs -f, exec with stdin,
port-forward and a 5 MiB object work the same through every replica; on the other two they cross
exactly one hop."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

from kasctl.stack import AGENT_ID, CONFIG_PROJECT, Stack
from tests.cluster.conftest import KUBECTLS, LineReader, kubectl_at, metric, wait_for_home
from tests.e2e.conftest import write_manifest
from tests.e2e.test_environments import (
    Job,
    deployment,
    get,
    graph_events,
    in_namespace,
    kasctl_env,
    recorded,
    status,
)


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
    """The one replica holding agentd's tunnel, once placement has settled it on the agent's home."""
    return wait_for_home(stack)


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
    write_manifest(manifest, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big"},
                              "data": {"blob": blob}})
    assert "created" in k("create", "-f", str(manifest))
    assert k("get", "configmap", "big", "-o", "jsonpath={.data.blob}") == blob

    forwarded = metric(three, replica, 'kasd_forwarded_requests_total{direction="out"}') - forwarded_before
    assert holder(three) == where  # the tunnel stayed put
    if holds:
        assert forwarded == 0  # the holder serves from its own tunnel
    else:
        assert forwarded >= 10  # every request above crossed the hop to the holder


# Environments among replicas (issue 27): in this module to share its stack.

def test_an_environment_is_seen_through_every_replica(three: Stack) -> None:
    """A CI job deploys through the replica holding the agent's tunnel; another replica serves the
    environment's objects and live graph through the hop; a third reads the history (Redis)."""
    where = holder(three)
    hop, third = (where + 1) % 3, (where + 2) % 3
    job = Job(three, "staging", 51, tier="staging")
    job.deploy("env-staging", deployment("staging", "web", {"kubesim.io/ready-after": "1h"}), replica=where)
    # the history written on the holder, read on the third: GitLab's list, then kasctl env list
    env = recorded(three, "staging", in_namespace("env-staging"), replica=third)
    history = get(three, f"/api/kasd/v1/environments/{env['id']}/deployments", replica=third)
    assert [(d["job_id"], d["namespaces"]) for d in history] == [(51, ["env-staging"])]
    listing = kasctl_env(three, "list", "--project", CONFIG_PROJECT, replica=third)
    assert listing.returncode == 0, listing.stderr
    # (the stack's own kubeconfig is the demo job deploying to production: that environment is listed too)
    rows = {line.split()[0]: line.split() for line in listing.stdout.splitlines()[1:]}
    assert rows["staging"][:4] == ["staging", "staging", "available", "Progressing"], listing.stdout
    # the objects and the live graph on a replica without the tunnel
    graph = get(three, f"/api/kasd/v1/environments/{env['id']}/resources", replica=hop)["graph"]
    assert status(graph, "apps/Deployment/env-staging/web") == "Progressing"
    events = graph_events(three, env["id"], replica=hop)
    assert status(next(events)) == "Progressing"
    job.kubectl("-n", "env-staging", "patch", "deployment", "web", "--type=merge", "-p",
                json.dumps({"spec": {"template": {"metadata": {"annotations": {"kubesim.io/ready-after": "1s"}}}}}),
                replica=third)
    deadline = time.monotonic() + 20
    for graph in events:  # each a graph event through the hop, until the rollout is done
        if status(graph) == "Healthy":
            break
        assert time.monotonic() < deadline, graph["health"]
    events.close()
    # /api/kasd/v1/agents on every replica shows the one tunnel in full: its holder from its registry,
    # the others from the holder's record in Redis
    answers = [next(a for a in get(three, "/api/kasd/v1/agents", replica=replica) if a["id"] == AGENT_ID)
               for replica in range(3)]
    (held,) = answers[where]["connections"]
    assert held["pod"] == "agentd-demo-0" and held["since"] and held["version"], held
    for replica in (hop, third):
        assert answers[replica]["connections"] == [held], answers[replica]


def test_one_kubectl_request_is_one_id_in_both_replicas_and_agentd(three: Stack) -> None:
    """A request on a replica without the tunnel: the id kubectl gets in X-Request-Id is in the
    access line of that replica, in the holder's line for the forwarded request and in agentd's."""
    where = holder(three)
    hop = (where + 1) % 3
    result = kubectl_at(KUBECTLS[-1][1], three, hop, "get", "--raw", "/api/v1/namespaces/default", "-v=8")
    assert result.returncode == 0, result.stderr
    (request_id,) = re.findall(r"X-Request-Id: ([0-9a-f]{32})\b", result.stderr)
    wanted = {
        f"kasd-{hop + 1}.log": "logger=kasd.access request request_id=" + request_id,
        f"kasd-{where + 1}.log": "logger=routing.peers forwarded request request_id=" + request_id,
        "agentd.log": "path=/api/v1/namespaces/default status=200 outcome=ok",
    }
    deadline = time.monotonic() + 10  # each line is written as its side ends the request
    while True:
        logs = {name: (three.dir / name).read_text(errors="replace") for name in wanted}
        found = {name: next((line for line in text.splitlines() if wanted[name] in line and request_id in line), "")
                 for name, text in logs.items()}
        if all(found.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.05)  # the daemons tell no one when a log line is written: the files are read again
    assert all(found.values()), found
    assert f"request_id={request_id}" in found["agentd.log"]
