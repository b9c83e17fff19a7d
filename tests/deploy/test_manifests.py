"""deploy/kubernetes: every kustomization builds with each kubectl found, and a real kubectl applies
what it builds to kubesim with --dry-run=server: every object "created (server dry run)", nothing
stored. The configuration each pod gets loads with the daemon's own loader, in the environment the
Deployment gives it; agentd's NetworkPolicy lets it reach kasd, the API server and DNS only.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml

from agentd.config import load_config as load_agentd_config
from kasd.config.loading import load_config as load_kasd_config
from tests.kubesim.kubectl_harness import ServerThread, kubectl_binaries

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
#: every directory holding a kustomization, bases included
KUSTOMIZATIONS = sorted(p.parent.relative_to(KUBERNETES).as_posix()
                        for p in KUBERNETES.rglob("kustomization.yaml"))
#: what an operator applies: the overlays, and kasd's base (it has none)
APPLIED = [k for k in KUSTOMIZATIONS if "/overlays/" in k or k == "kasd/base"]
KUBECTLS = kubectl_binaries()
NEWEST = KUBECTLS[-1][1] if KUBECTLS else ""
#: namespaces the manifests put objects in (an operator creates them first, as a real API server
#: refuses even a dry run into a namespace that does not exist)
NAMESPACES = ("agentd", "apps", "kasd")


@functools.cache
def kustomize(directory: str, kubectl: str = NEWEST) -> str:
    """What `kubectl kustomize` makes of the directory (once per module and kubectl)."""
    out = subprocess.run([kubectl, "kustomize", str(KUBERNETES / directory)], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout


def build(directory: str, kubectl: str = NEWEST) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(kustomize(directory, kubectl)) if doc]


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    for obj in objects:
        if obj["kind"] == kind and (name is None or obj["metadata"]["name"] == name):
            return obj
    raise AssertionError(f"no {kind} {name or ''} in {[o['kind'] for o in objects]}")


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    server = ServerThread(tmp_path_factory.mktemp("kubesim")).start()
    try:
        for namespace in NAMESPACES:
            server.make_namespace(namespace)
        yield server
    finally:
        server.stop()


def test_every_kustomization_is_found() -> None:
    assert KUSTOMIZATIONS == ["agentd/base", "agentd/overlays/namespace-admin",
                              "agentd/overlays/read-only", "kasd/base"]


@pytest.mark.skipif(not KUBECTLS, reason="no kubectl binary found")
@pytest.mark.parametrize("kubectl", [path for _, path in KUBECTLS], ids=[f"kubectl-{m}" for m, _ in KUBECTLS])
@pytest.mark.parametrize("directory", APPLIED)
def test_applies_to_kubesim_as_a_server_dry_run(sim: ServerThread, kubectl: str, directory: str) -> None:
    objects = build(directory, kubectl)
    manifest = kustomize(directory, kubectl)
    before = sim.call(lambda: sim.sim.store.statistics())  # type: ignore[union-attr]
    out = subprocess.run([kubectl, "apply", "--dry-run=server", "-f", "-"], input=manifest,
                         capture_output=True, text=True, timeout=30, env=sim.env())
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == len(objects), out.stdout
    for obj in objects:
        group = obj["apiVersion"].rpartition("/")[0]
        resource = f"{obj['kind'].lower()}{'.' + group if group else ''}/{obj['metadata']['name']}"
        assert f"{resource} created (server dry run)" in lines, (resource, out.stdout)
    after = sim.call(lambda: sim.sim.store.statistics())  # type: ignore[union-attr]
    assert (after.objects, after.resource_version) == (before.objects, before.resource_version)


@pytest.mark.skipif(not KUBECTLS, reason="no kubectl binary found")
def test_a_bad_object_is_refused_by_the_dry_run_with_a_status(sim: ServerThread) -> None:
    """The dry run validates as a create would: an unknown field of a PodDisruptionBudget is named."""
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
           "metadata": {"name": "bad", "namespace": "agentd"},
           "spec": {"minAvailable": 1, "selektor": {}}}
    out = subprocess.run([NEWEST, "apply", "--dry-run=server", "-f", "-"], input=yaml.safe_dump(pdb),
                         capture_output=True, text=True, timeout=30, env=sim.env())
    assert out.returncode != 0
    assert 'unknown field "spec.selektor"' in out.stderr


def _rooted(text: str, prefix: str, tmp: Path) -> str:
    return text.replace(prefix, str(tmp) + prefix)


@pytest.mark.skipif(not KUBECTLS, reason="no kubectl binary found")
def test_kasd_pods_config_loads_with_the_addresses_the_deployment_gives_each_replica(tmp_path: Path) -> None:
    objects = build("kasd/base")
    config = find(objects, "ConfigMap")["data"]["kasd.yaml"]
    container = find(objects, "Deployment", "kasd")["spec"]["template"]["spec"]["containers"][0]
    # the files the Secrets become, where the Deployment mounts them (under tmp_path)
    ca = trustme.CA()
    for mount in ("tls", "peer-tls"):
        directory = tmp_path / "etc/kasd" / mount
        directory.mkdir(parents=True)
        cert = ca.issue_cert("kas.example.com", "*.kasd-peers.kasd.svc.cluster.local")
        cert.cert_chain_pems[0].write_to_path(str(directory / "tls.crt"))
        cert.private_key_pem.write_to_path(str(directory / "tls.key"))
        ca.cert_pem.write_to_path(str(directory / "ca.crt"))
    (tmp_path / "etc/kasd/peer").mkdir()
    (tmp_path / "etc/kasd/peer/secret").write_text("s" * 40)
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/etc/kasd", "/etc/kasd/tls", "/etc/kasd/peer-tls", "/etc/kasd/peer"} <= mounts
    (tmp_path / "etc/kasd/kasd.yaml").write_text(_rooted(config, "/etc/kasd/", tmp_path))
    # the environment the pod gets: the downward API's values, $(POD_IP) expanded as the kubelet does,
    # then the container's shell line run for real (with env standing in for kasd)
    downward = {"status.podIP": "10.244.1.5", "metadata.namespace": "kasd"}
    environ: dict[str, str] = {}
    for var in container["env"]:
        if "valueFrom" in var:
            environ[var["name"]] = downward[var["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            environ[var["name"]] = re.sub(r"\$\((\w+)\)", lambda m: environ[m.group(1)], var["value"])
    script = container["command"][2].replace("/opt/kasd/bin/kasd", "/usr/bin/env")
    shown = subprocess.run([container["command"][0], "-c", script, "kasd"], env=environ, capture_output=True,
                           text=True, timeout=10, check=True).stdout
    environ = dict(line.split("=", 1) for line in shown.splitlines())
    args = [a.replace("/etc/kasd/", f"{tmp_path}/etc/kasd/") for a in container["args"]]
    loaded = load_kasd_config(args, environ)
    assert loaded.routing.name == "10.244.1.5:8154"
    assert loaded.routing.private_url == "https://10-244-1-5.kasd-peers.kasd.svc.cluster.local:8155"
    assert loaded.routing.agent_url == "https://10-244-1-5.kasd-peers.kasd.svc.cluster.local:8150/tunnel"
    assert loaded.routing.redis.url == "redis://kasd-redis:6379/0"
    # what the Services and probes name is what kasd listens on
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"agent": 8150, "observability": 8151, "api": 8153, "kubernetes-api": 8154, "private": 8155}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readiness", "port": "observability"}
    for service in ("kasd", "kasd-peers"):
        for port in find(objects, "Service", service)["spec"]["ports"]:
            assert ports[port["targetPort"]] == port["port"]
    assert find(objects, "Service", "kasd-peers")["spec"]["clusterIP"] == "None"
    assert find(objects, "Deployment", "kasd")["spec"]["replicas"] == 3
    # the variables loaded above are all the pod has: no service links (KASD_PORT_8150_TCP…)
    assert find(objects, "Deployment", "kasd")["spec"]["template"]["spec"]["enableServiceLinks"] is False


@pytest.mark.skipif(not KUBECTLS, reason="no kubectl binary found")
@pytest.mark.parametrize("overlay", ["read-only", "namespace-admin"])
def test_agentd_pods_config_loads_and_its_probes_name_the_health_port(tmp_path: Path, overlay: str) -> None:
    objects = build(f"agentd/overlays/{overlay}")
    config = find(objects, "ConfigMap")["data"]["agentd.yaml"]
    deployment = find(objects, "Deployment", "agentd")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["template"]["spec"]["enableServiceLinks"] is False
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    (tmp_path / "etc/agentd/token").mkdir(parents=True)
    (tmp_path / "etc/agentd/token/token").write_text("agent-token-for-prod\n")
    (tmp_path / "etc/agentd/agentd.yaml").write_text(_rooted(config, "/etc/agentd/", tmp_path))
    environ = {v["name"]: v.get("value", "x") for v in container["env"]}
    environ["KUBERNETES_SERVICE_HOST"] = "10.96.0.1"
    args = [a.replace("/etc/agentd/", f"{tmp_path}/etc/agentd/") for a in container["args"]]
    loaded = load_agentd_config(args, environ)
    assert str(loaded.health_address) == "0.0.0.0:8080"
    assert loaded.in_cluster
    assert loaded.namespaces == (("apps",) if overlay == "namespace-admin" else ())
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"health": 8080}
    assert container["livenessProbe"]["httpGet"] == {"path": "/liveness", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readiness", "port": "health"}
    token = find(objects, "Secret", "agentd-token")
    volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if "secret" in v)
    assert volume["secret"]["secretName"] == token["metadata"]["name"]
    assert "token" in token["stringData"]


def test_agentd_may_reach_only_kasd_the_api_server_and_dns() -> None:
    policy = find(build("agentd/base"), "NetworkPolicy", "agentd")["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    assert policy["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "agentd"}}
    egress = [(sorted((p["protocol"], p["port"]) for p in rule["ports"]), rule["to"]) for rule in policy["egress"]]
    assert egress == [
        ([("TCP", 8150)], [{"ipBlock": {"cidr": "192.0.2.10/32"}}]),                     # kasd
        ([("TCP", 443), ("TCP", 6443)], [{"ipBlock": {"cidr": "192.0.2.1/32"}}]),         # API server
        ([("TCP", 53), ("UDP", 53)], [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                                       "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}]),
    ]
    # nothing may dial agentd but its health port (probes, Prometheus)
    assert policy["ingress"] == [{"ports": [{"protocol": "TCP", "port": 8080}]}]


def test_only_kasd_replicas_may_reach_the_private_port_and_redis() -> None:
    objects = build("kasd/base")
    replicas = [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "kasd"}}}]
    kasd = find(objects, "NetworkPolicy", "kasd")["spec"]
    assert kasd["policyTypes"] == ["Ingress"]
    anyone = [rule for rule in kasd["ingress"] if "from" not in rule]
    assert {p["port"] for rule in anyone for p in rule["ports"]} == {8150, 8151, 8153, 8154}
    assert [rule for rule in kasd["ingress"] if "from" in rule] == [
        {"from": replicas, "ports": [{"protocol": "TCP", "port": 8155}]}]
    redis = find(objects, "NetworkPolicy", "kasd-redis")["spec"]
    assert redis["ingress"] == [{"from": replicas, "ports": [{"protocol": "TCP", "port": 6379}]}]


def test_pods_run_as_non_root_with_a_read_only_root_and_no_capabilities() -> None:
    for directory in ("agentd/base", "kasd/base"):
        for obj in build(directory):
            if obj["kind"] not in ("Deployment", "StatefulSet"):
                continue
            pod = obj["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsNonRoot"] is True
            assert pod["securityContext"]["runAsUser"] > 0
            assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
            for container in pod["containers"]:
                assert container["securityContext"] == {
                    "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]}}, obj["metadata"]["name"]
                assert "@sha256:" in container["image"] or container["image"].startswith("registry.example.com/")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None and not os.environ.get("CI"),
                    reason="no systemd-analyze: Debian's systemd package has it (scripts/test.sh installs it "
                    "with KASD_TEST_INSTALL=1 as root; CI installs it and always runs this check)")
@pytest.mark.parametrize("unit", ["kasd.service", "agentd.service"])
def test_systemd_unit_verifies(tmp_path: Path, unit: str) -> None:
    """`systemd-analyze verify` checks that each ExecStart= binary exists: the unit is verified with
    /usr/local/bin/<daemon> pointing at this environment's, its text otherwise unchanged."""
    daemon = unit.removesuffix(".service")
    binary = Path(shutil.which(daemon) or Path(sys.executable).parent / daemon)
    assert binary.exists()
    text = (ROOT / "examples" / unit).read_text()
    assert f"/usr/local/bin/{daemon} " in text
    (tmp_path / unit).write_text(text.replace(f"/usr/local/bin/{daemon} ", f"{binary} "))
    out = subprocess.run(["systemd-analyze", "verify", str(tmp_path / unit)], capture_output=True,
                         text=True, timeout=30)
    complaints = [line for line in (out.stdout + out.stderr).splitlines() if unit in line]
    assert out.returncode == 0 and not complaints, out.stdout + out.stderr
