"""Pod topology and cluster discovery among replicas (issue 28 items 3 and 5), real processes: two
kasd replicas sharing a redis-server, two agentd pods of one agent (each with a tunnel on both
replicas, placement's way), kubesim. Any replica lists every pod with its namespace, node and the
replica holding each tunnel (``GET /api/kasd/v1/agents``, ``kasctl agents``), and serves each pod's
cluster report; a CRD added to the cluster later shows up in the reports (agentd noticed the change)."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kasctl.stack import AGENT_ID, AGENTD_NAMESPACE, Stack, find_kubectl
from tests.cluster.conftest import replicated_stack

pytestmark = pytest.mark.timeout(120)

FLUX_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "gitrepositories.source.toolkit.fluxcd.io"},
    "spec": {"group": "source.toolkit.fluxcd.io", "scope": "Namespaced",
             "names": {"plural": "gitrepositories", "singular": "gitrepository", "kind": "GitRepository"},
             "versions": [{"name": "v1", "served": True, "storage": True,
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]},
}


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = replicated_stack(tmp_path_factory.mktemp("disco"), replicas=2, agentd_replicas=2, agentd_connections=2,
                             agentd_settings={"discovery_interval": 0.5})
    try:
        yield stack
    finally:
        codes = stack.stop()
        assert set(codes.values()) == {0}, codes


def _get(stack: Stack, replica: int, path: str) -> Any:
    context = ssl.create_default_context(cafile=str(stack.ca_file))
    request = urllib.request.Request(f"https://{stack.replica_addresses[replica]['api']}{path}",
                                     headers={"PRIVATE-TOKEN": stack.personal_token})
    with urllib.request.urlopen(request, context=context, timeout=10) as answer:
        return json.loads(answer.read())


def _until(what: str, check: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g}s"
        time.sleep(0.1)


def _connections(stack: Stack, replica: int) -> list[dict[str, Any]]:
    agents = _get(stack, replica, "/api/kasd/v1/agents")
    return next(a for a in agents if a["id"] == AGENT_ID)["connections"]


def test_every_replica_lists_every_pod_with_its_namespace_node_and_replica(two: Stack) -> None:
    for replica in (0, 1):
        connections = _until(f"four tunnels listed by replica {replica}", lambda r=replica: (
            c if len(c := _connections(two, r)) == 4 and all(x["pod"] for x in c) else None))
        pods = {(c["pod"], c["pod_namespace"], c["node"]) for c in connections}
        assert pods == {("agentd-demo-0", AGENTD_NAMESPACE, "sim-node-0"),
                        ("agentd-demo-1", AGENTD_NAMESPACE, "sim-node-1")}
        # each pod keeps a tunnel on each replica: this replica lists the other's from Redis
        by_pod = {pod: {c["replica"] for c in connections if c["pod"] == pod} for pod, _, _ in pods}
        assert all(len(replicas) == 2 for replicas in by_pod.values()), by_pod
        assert all(c["namespaces"] == [] and c["pod_uid"] and c["version"] and c["since"] for c in connections)
    replica_names = {c["replica"] for c in connections}

    env = {**os.environ, "KASCTL_TOKEN": two.personal_token, "KASCTL_API_URL": f"https://{two.replica_addresses[1]['api']}",
           "KASCTL_CA_FILE": str(two.ca_file)}
    table = subprocess.run([sys.executable, "-m", "kasctl", "agents"], env=env, capture_output=True, text=True,
                           timeout=30)
    assert table.returncode == 0, table.stderr
    header, *lines = table.stdout.splitlines()
    assert header.split() == ["AGENT", "POD", "NAMESPACE", "NODE", "SERVES", "REPLICA", "VERSION", "SINCE"]
    demo = [line.split() for line in lines if line.startswith(f"{AGENT_ID} (")]
    assert sorted((row[2], row[4], row[6]) for row in demo) == sorted(
        (pod, node, replica) for pod, node in (("agentd-demo-0", "sim-node-0"), ("agentd-demo-1", "sim-node-1"))
        for replica in replica_names)
    as_json = subprocess.run([sys.executable, "-m", "kasctl", "agents", "--agent", str(AGENT_ID), "-o", "json"],
                             env=env, capture_output=True, text=True, timeout=30)
    assert as_json.returncode == 0, as_json.stderr
    assert len(json.loads(as_json.stdout)[0]["connections"]) == 4


def test_the_cluster_report_of_each_pod_shows_the_cluster_and_a_crd_added_later(two: Stack) -> None:
    def reports(replica: int) -> list[dict[str, Any]]:
        return list(_get(two, replica, f"/api/kasd/v1/agents/{AGENT_ID}/cluster")["pods"])

    first = _until("both pods' reports", lambda: r if len(r := reports(0)) == 2 else None)
    assert {p["pod"] for p in first} == {"agentd-demo-0", "agentd-demo-1"}
    for pod in first:
        report = pod["report"]
        assert report["server"] == {"gitVersion": "v1.32.0", "platform": "linux/amd64"}
        assert "apps" in report["api_groups"] and report["nodes"] is not None
        assert report["rbac"][0]["namespace"] == "default" and report["rbac"][0]["resource_rules"]
        assert not any(c["name"] == "Flux" for c in report["components"])

    kubectl = find_kubectl()
    assert kubectl is not None
    created = subprocess.run([kubectl, "--kubeconfig", str(two.dir / "cluster.kubeconfig"), "create", "-f", "-"],
                             input=json.dumps(FLUX_CRD), capture_output=True, text=True, timeout=30)
    assert created.returncode == 0, created.stderr

    def flux_everywhere() -> list[dict[str, Any]] | None:
        found = reports(1)  # the other replica answers the same: the reports are in Redis
        return found if len(found) == 2 and all(
            {"name": "Flux", "evidence": ["source.toolkit.fluxcd.io"]} in p["report"]["components"]
            and "gitrepositories.source.toolkit.fluxcd.io" in p["report"]["crds"] for p in found) else None

    _until("Flux in both pods' reports", flux_everywhere)
