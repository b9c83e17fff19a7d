"""agentd's cluster discovery: the component table, the size bound, and a real run against kubesim
with a service account of limited reach, reported to a kasd on a ``cluster-info`` stream."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from agentd.discovery import COMPONENTS, MAX_REPORT_BYTES, components_of, encoded, fit, pool_fetch
from agentd.kubeapi import kubeconfig_target
from agentd.upstream import UpstreamPool
from kubesim.server import open_kubesim
from tests.agentd.harness import AGENT_TOKEN, SIM_TOKEN, agent_config, running_agent
from tests.agentd.test_tunnels import write_kubeconfig
from tunnelhttp.kinds import KIND_CLUSTER_INFO
from wire.h2carrier import serve_h2_tunnels
from wire.session import Session

pytestmark = pytest.mark.timeout(20)


def test_components_are_named_by_the_groups_and_crds_that_reveal_them() -> None:
    found = components_of(
        ["apps", "source.toolkit.fluxcd.io", "kustomize.toolkit.fluxcd.io", "monitoring.coreos.com",
         "networking.istio.io", "templates.gatekeeper.sh", "fluxcd.io.example.com"],
        ["certificates.cert-manager.io", "applications.argoproj.io", "widgets.example.com"])
    assert found == [
        {"name": "Flux", "evidence": ["kustomize.toolkit.fluxcd.io", "source.toolkit.fluxcd.io"]},
        {"name": "cert-manager", "evidence": ["cert-manager.io"]},
        {"name": "Prometheus operator", "evidence": ["monitoring.coreos.com"]},
        {"name": "Istio", "evidence": ["networking.istio.io"]},
        {"name": "Argo CD", "evidence": ["argoproj.io"]},
        {"name": "Gatekeeper", "evidence": ["templates.gatekeeper.sh"]},
    ]
    # a look-alike group reveals nothing; every entry of the table names itself once
    assert components_of(["toolkit.fluxcd.io.evil.com", "notcert-manager.io"], []) == []
    assert len({name for name, _ in COMPONENTS}) == len(COMPONENTS)


def test_a_report_over_the_size_limit_is_cut_to_fit_saying_what_went() -> None:
    rule = {"apiGroups": ["x" * 100], "resources": ["y" * 100], "verbs": ["get"]}
    report: dict[str, Any] = {
        "observed_at": "2026-01-01T00:00:00Z", "server": {}, "nodes": 3, "api_groups": ["apps"],
        "crds": [f"{'c' * 60}{n}.example.com" for n in range(5000)], "components": [],
        "rbac": [{"namespace": "default", "resource_rules": [rule] * 2000, "non_resource_rules": [],
                  "incomplete": False}], "errors": []}
    cut = fit(report)
    assert len(encoded(cut)) <= MAX_REPORT_BYTES
    assert cut["rbac"][0]["incomplete"] is True and cut["rbac"][0]["resource_rules"] == []
    assert 0 < len(cut["crds"]) < 5000 and cut["api_groups"] == ["apps"]
    assert any("crds: list cut short" in e for e in cut["errors"])


class ReportingKasd:
    """A kasd that keeps the HELLO of each tunnel and every cluster-info report agentd sends."""

    def __init__(self) -> None:
        self.hellos: list[dict[str, Any]] = []
        self.reports: list[dict[str, Any]] = []
        self.changed = trio.Event()

    async def authenticate(self, token: str, headers: dict[str, str]) -> Any:
        return {"agent": 7} if token == AGENT_TOKEN else None

    async def handler(self, session: Session, principal: Any) -> None:
        self.hellos.append(dict(session.connection.peer_metadata))
        while True:
            try:
                stream = await session.accept_stream()
            except trio.BrokenResourceError:
                return
            assert stream.metadata == {"v": 1, "kind": KIND_CLUSTER_INFO}
            body = b""
            while chunk := await stream.receive_some():
                body += chunk
            await stream.accept({})
            await stream.aclose()
            self.reports.append(json.loads(body))
            self.changed.set()
            self.changed = trio.Event()

    async def report_where(self, predicate: Any) -> dict[str, Any]:
        while not (self.reports and predicate(self.reports[-1])):
            await self.changed.wait()
        return self.reports[-1]


LIMITED = [
    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}},
    {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "agentd", "namespace": "team-a"}},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "pods", "namespace": "team-a"},
     "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
     "metadata": {"name": "agentd-pods", "namespace": "team-a"},
     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods"},
     "subjects": [{"kind": "ServiceAccount", "name": "agentd", "namespace": "team-a"}]},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "crd-reader"},
     "rules": [{"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
                "verbs": ["get", "list"]}]},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "agentd-crds"},
     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "crd-reader"},
     "subjects": [{"kind": "ServiceAccount", "name": "agentd", "namespace": "team-a"}]},
]

FLUX_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "kustomizations.kustomize.toolkit.fluxcd.io"},
    "spec": {"group": "kustomize.toolkit.fluxcd.io", "scope": "Namespaced",
             "names": {"plural": "kustomizations", "singular": "kustomization", "kind": "Kustomization"},
             "versions": [{"name": "v1", "served": True, "storage": True,
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]},
}


async def test_agentd_reports_its_cluster_its_reach_and_then_a_crd_added_later(nursery: trio.Nursery,
                                                                               tmp_path: Path) -> None:
    async with open_kubesim(objects=LIMITED, token=SIM_TOKEN) as sim:
        admin = UpstreamPool(kubeconfig_target(write_kubeconfig(tmp_path / "admin", sim.url, SIM_TOKEN)))
        as_admin = pool_fetch(admin)
        status, issued = await as_admin("POST", "/api/v1/namespaces/team-a/serviceaccounts/agentd/token",
                                        json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                                    "spec": {}}).encode())
        assert status == 201, issued
        write_kubeconfig(tmp_path / "kubeconfig", sim.url, issued["status"]["token"])

        kasd = ReportingKasd()
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        await nursery.start(lambda task_status: serve_h2_tunnels(kasd.handler, listeners,
                                                                 authenticate=kasd.authenticate,
                                                                 task_status=task_status))
        url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}/tunnel"
        config = agent_config(tmp_path, url, pod_namespace="team-a", node_name="node-1", namespaces=("team-a",),
                              discovery_interval=0.2)
        async with running_agent(nursery, config, kubeconfig_target(config.kubeconfig)):
            with trio.fail_after(10):
                first = await kasd.report_where(lambda r: True)
            hello = kasd.hellos[0]
            assert (hello["pod_namespace"], hello["node_name"], hello["namespaces"]) == ("team-a", "node-1",
                                                                                         ["team-a"])
            assert first["server"] == {"gitVersion": "v1.32.0", "platform": "linux/amd64"}
            # what its service account may not read is said, not fatal
            assert first["nodes"] is None
            assert any(e.startswith("nodes: forbidden:") for e in first["errors"]), first["errors"]
            assert first["crds"] == [] and first["components"] == []
            (review,) = first["rbac"]
            assert review["namespace"] == "team-a"
            assert {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]} in \
                review["resource_rules"]

            status, _ = await as_admin("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                                       json.dumps(FLUX_CRD).encode())
            assert status == 201
            with trio.fail_after(10):
                later = await kasd.report_where(lambda r: r["crds"])
            assert later["crds"] == ["kustomizations.kustomize.toolkit.fluxcd.io"]
            assert later["components"] == [{"name": "Flux", "evidence": ["kustomize.toolkit.fluxcd.io"]}]
            # unchanged checks in between sent nothing: one report per change
            assert len(kasd.reports) == 2
        await admin.aclose()
