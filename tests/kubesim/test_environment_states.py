"""The cluster states issue 27's environment views show, reached in kubesim and read with real
kubectl (`get -o json`, the fields a real API server and kubelet fill): a rollout that takes time,
an image that cannot be pulled, an OOMKilled container, load balancer addresses, Flux objects with
status conditions, Job failure and suspension, the events of each, and the demo's manifest.
Time passes on the server's clock (`KubeSim.advance_clock`), never by sleeping."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.kubesim.kubectl_harness import NamespacedKubectl, ServerThread, table_rows

pytestmark = pytest.mark.timeout(90)

REPO = Path(__file__).resolve().parents[2]
GITLAB_LABELS = {"app.gitlab.com/project_id": "1", "app.gitlab.com/environment_slug": "production"}
_COUNTER = iter(range(10_000))


class K(NamespacedKubectl):

    async def advance(self, seconds: float) -> None:
        """Let `seconds` pass on the server's clock."""
        sim = self.server.sim
        assert sim is not None
        await self.server.acall(sim.advance_clock, seconds)

    async def create(self, manifest: dict[str, Any]) -> None:
        await self("create", "-f", "-", stdin=json.dumps(manifest).encode())

    async def events(self, name: str) -> list[dict[str, Any]]:
        listing = await self.json("events", "--field-selector", f"involvedObject.name={name}")
        return sorted(listing["items"], key=lambda e: int(e["metadata"]["resourceVersion"]))


@pytest.fixture
def k(kube_server: ServerThread, kubectl_bin: str) -> K:
    namespace = f"envstates-{next(_COUNTER)}"
    kube_server.make_namespace(namespace)
    return K(kubectl_bin, kube_server, namespace)


def _deployment(name: str, *, annotations: dict[str, str] | None = None, image: str = "nginx:1.27",
                replicas: int = 2) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": GITLAB_LABELS},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": {
                "metadata": {"labels": {"app": name}, "annotations": annotations or {}},
                "spec": {"containers": [{"name": "web", "image": image}]}}}}


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in obj["status"]["conditions"] if c["type"] == kind)


def _waiting(pod: dict[str, Any]) -> dict[str, Any]:
    return (pod["status"]["containerStatuses"][0]["state"].get("waiting")) or {}


async def _only_pod(k: K, selector: str) -> dict[str, Any]:
    listing = await k.json("pods", "-l", selector)
    assert len(listing["items"]) == 1, listing["items"]
    return dict(listing["items"][0])


async def test_rollout_with_ready_after_is_progressing_then_available(k: K) -> None:
    await k.create(_deployment("slow", annotations={"kubesim.io/ready-after": "30s"}))
    dep = await k.wait_until("deployment/slow", lambda d: d["status"].get("updatedReplicas") == 2)
    # Rolling out: pods run but are not Ready, so nothing is available yet
    assert dep["status"]["observedGeneration"] == dep["metadata"]["generation"] == 1
    assert dep["status"]["replicas"] == 2 and dep["status"]["unavailableReplicas"] == 2
    assert "availableReplicas" not in dep["status"] and "readyReplicas" not in dep["status"]
    progressing = _condition(dep, "Progressing")
    rs_name = f"slow-{(await k.json('rs', '-l', 'app=slow'))['items'][0]['metadata']['labels']['pod-template-hash']}"
    assert (progressing["status"], progressing["reason"]) == ("True", "ReplicaSetUpdated")
    assert progressing["message"] == f'ReplicaSet "{rs_name}" is progressing.'
    available = _condition(dep, "Available")
    assert (available["status"], available["reason"]) == ("False", "MinimumReplicasUnavailable")
    pods = (await k.json("pods", "-l", "app=slow"))["items"]
    assert [p["status"]["phase"] for p in pods] == ["Running", "Running"]
    for pod in pods:
        ready = _condition(pod, "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "ContainersNotReady")
        assert ready["message"] == "containers with unready status: [web]"
        assert pod["status"]["containerStatuses"][0]["started"] is True
        assert pod["status"]["containerStatuses"][0]["ready"] is False

    await k.advance(30)
    dep = await k.wait_until("deployment/slow", lambda d: d["status"].get("availableReplicas") == 2)
    assert dep["status"]["readyReplicas"] == dep["status"]["updatedReplicas"] == 2
    assert "unavailableReplicas" not in dep["status"]
    progressing = _condition(dep, "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("True", "NewReplicaSetAvailable")
    assert progressing["message"] == f'ReplicaSet "{rs_name}" has successfully progressed.'
    assert (_condition(dep, "Available")["status"], _condition(dep, "Available")["reason"]) == (
        "True", "MinimumReplicasAvailable")
    for pod in (await k.json("pods", "-l", "app=slow"))["items"]:
        assert _condition(pod, "Ready")["status"] == "True" and "reason" not in _condition(pod, "Ready")
    # The controllers' events, found by the object's name as a dashboard asks for them
    scaled = await k.events("slow")
    assert [(e["reason"], e["message"], e["involvedObject"]["kind"]) for e in scaled] == [
        ("ScalingReplicaSet", f"Scaled up replica set {rs_name} from 0 to 2", "Deployment")]
    created = await k.events(rs_name)
    assert {e["reason"] for e in created} == {"SuccessfulCreate"} and len(created) == 2
    pod_events = await k.events(pods[0]["metadata"]["name"])
    assert pod_events[0]["reason"] == "Scheduled"
    assert {"Pulled", "Created", "Started"} <= {e["reason"] for e in pod_events}
    assert all(e["source"]["component"] in ("default-scheduler", "kubelet") for e in pod_events)


async def test_image_that_cannot_be_pulled_backs_off(k: K) -> None:
    image = "registry.invalid/group/app:1.0"
    await k.create(_deployment("nopull", image=image, replicas=1))
    pod = await k.wait_until("pods", lambda p: p["items"] and _waiting(p["items"][0]).get("reason") == "ErrImagePull")
    pod = pod["items"][0]
    assert pod["status"]["phase"] == "Pending"
    entry = pod["status"]["containerStatuses"][0]
    assert entry["ready"] is False and entry["started"] is False and entry["restartCount"] == 0
    assert entry["image"] == image and entry["imageID"] == ""
    error = (f'rpc error: code = Unknown desc = failed to pull and unpack image "{image}": failed to '
             f'resolve reference "{image}": failed to do request: Head "https://registry.invalid/v2/'
             'group/app/manifests/1.0": dial tcp: lookup registry.invalid on 127.0.0.11:53: no such host')
    assert _waiting(pod)["message"] == error
    assert (_condition(pod, "Ready")["status"], _condition(pod, "Ready")["reason"]) == ("False", "ContainersNotReady")
    name = pod["metadata"]["name"]
    events = [(e["type"], e["reason"], e["message"]) for e in await k.events(name)]
    assert events[0][1] == "Scheduled"
    assert events[1:] == [("Normal", "Pulling", f'Pulling image "{image}"'),
                          ("Warning", "Failed", f'Failed to pull image "{image}": {error}'),
                          ("Warning", "Failed", "Error: ErrImagePull")]
    assert table_rows(await k.out("get", "pod", name))[1][2] == "ErrImagePull"

    await k.advance(10)  # the kubelet's next sync finds the image in back-off
    pod = await k.wait_until(f"pod/{name}", lambda p: _waiting(p).get("reason") == "ImagePullBackOff")
    assert _waiting(pod)["message"] == f'Back-off pulling image "{image}": ErrImagePull: {error}'
    assert pod["status"]["phase"] == "Pending"
    events = [(e["type"], e["reason"], e["message"]) for e in await k.events(name)]
    assert events[-2:] == [("Normal", "BackOff", f'Back-off pulling image "{image}"'),
                           ("Warning", "Failed", "Error: ImagePullBackOff")]
    assert table_rows(await k.out("get", "pod", name))[1][2] == "ImagePullBackOff"
    dep = await k.json("deployment/nopull")
    assert _condition(dep, "Available")["status"] == "False"
    assert _condition(dep, "Progressing")["reason"] == "ReplicaSetUpdated"

    await k.advance(10)  # 20 s after the first failure: pulled again, and failing again
    pod = await k.wait_until(f"pod/{name}", lambda p: _waiting(p).get("reason") == "ErrImagePull")
    # the same events again: counted on the first ones, as client-go's correlator does
    events = await k.events(name)
    [pulling] = [e for e in events if e["reason"] == "Pulling"]
    assert pulling["count"] == 2 and pulling["lastTimestamp"] > pulling["firstTimestamp"]
    assert sorted(e["count"] for e in events if e["reason"] == "Failed") == [1, 2, 2]  # not ImagePullBackOff yet


async def test_oom_killed_container_crash_loops(k: K) -> None:
    await k.create(_deployment("hungry", annotations={"kubesim.io/oom-kill": "true"}, replicas=1))
    pod = await k.wait_until("pods", lambda p: p["items"] and p["items"][0]["status"].get("containerStatuses")
                             and p["items"][0]["status"]["containerStatuses"][0].get("lastState"))
    pod = pod["items"][0]
    entry = pod["status"]["containerStatuses"][0]
    assert entry["lastState"]["terminated"]["reason"] == "OOMKilled"
    assert entry["lastState"]["terminated"]["exitCode"] == 137
    assert entry["restartCount"] >= 1 and entry["ready"] is False
    meta = pod["metadata"]
    assert _waiting(pod) == {"reason": "CrashLoopBackOff", "message": (
        f"back-off 10s restarting failed container=web pod={meta['name']}_{meta['namespace']}({meta['uid']})")}
    assert pod["status"]["phase"] == "Running"


async def test_load_balancer_and_ingress_get_addresses(k: K) -> None:
    await k.create({"apiVersion": "v1", "kind": "Service", "metadata": {
        "name": "front", "labels": GITLAB_LABELS, "annotations": {"kubesim.io/load-balancer-after": "60s"}},
        "spec": {"type": "LoadBalancer", "selector": {"app": "front"}, "ports": [{"port": 80}]}})
    await k.create({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "front"},
                    "spec": {"rules": [{"host": "front.example.com", "http": {"paths": [{
                        "path": "/", "pathType": "Prefix",
                        "backend": {"service": {"name": "front", "port": {"number": 80}}}}]}}]}})
    svc = await k.json("service/front")
    assert svc["status"] == {"loadBalancer": {}}  # pending
    port = svc["spec"]["ports"][0]
    assert 30000 <= port["nodePort"] <= 32767
    assert svc["spec"]["externalTrafficPolicy"] == "Cluster" and svc["spec"]["allocateLoadBalancerNodePorts"] is True
    assert table_rows(await k.out("get", "service", "front"))[1][3] == "<pending>"
    ingress = await k.wait_until("ingress/front", lambda i: (i.get("status") or {}).get("loadBalancer", {}).get("ingress"))
    assert ingress["status"] == {"loadBalancer": {"ingress": [{"ip": "172.18.255.200"}]}}

    await k.advance(60)
    svc = await k.wait_until("service/front", lambda s: s["status"]["loadBalancer"].get("ingress"))
    [address] = svc["status"]["loadBalancer"]["ingress"]
    assert address["ipMode"] == "VIP" and address["ip"].startswith("172.18.")
    assert table_rows(await k.out("get", "service", "front"))[1][3] == address["ip"]
    assert [(e["reason"], e["message"]) for e in await k.events("front") if e["involvedObject"]["kind"] == "Service"] == [
        ("EnsuringLoadBalancer", "Ensuring load balancer"), ("EnsuredLoadBalancer", "Ensured load balancer")]


async def test_flux_objects_from_the_example_crds(k: K) -> None:
    await k("apply", "-f", str(REPO / "examples" / "manifests" / "flux-crds.yaml"))
    await k("wait", "--for=condition=Established", "crd/kustomizations.kustomize.toolkit.fluxcd.io",
            "crd/helmreleases.helm.toolkit.fluxcd.io", "crd/gitrepositories.source.toolkit.fluxcd.io")
    manifests = [
        {"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository", "metadata": {"name": "app", "labels": GITLAB_LABELS},
         "spec": {"interval": "1m", "url": "https://gitlab.example.com/group/app.git", "ref": {"branch": "main"}}},
        {"apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization", "metadata": {"name": "app", "labels": GITLAB_LABELS},
         "spec": {"interval": "10m", "path": "./deploy", "prune": True, "sourceRef": {"kind": "GitRepository", "name": "app"}}},
        {"apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease", "metadata": {"name": "app", "labels": GITLAB_LABELS},
         "spec": {"interval": "5m", "chart": {"spec": {"chart": "podinfo", "sourceRef": {"kind": "HelmRepository", "name": "podinfo"}}}}},
    ]
    for manifest in manifests:
        await k.create(manifest)
    ready = {"type": "Ready", "status": "False", "reason": "ReconciliationFailed", "observedGeneration": 1,
             "message": "kustomize build failed: no such file", "lastTransitionTime": "2026-01-02T03:04:05Z"}
    for kind in ("gitrepository", "kustomization", "helmrelease"):
        # what the controller writes: only through the status subresource
        await k("patch", f"{kind}/app", "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": {"observedGeneration": 1, "conditions": [ready]}}))
        obj = await k.json(f"{kind}/app")
        assert obj["status"]["conditions"] == [ready] and obj["metadata"]["labels"] == GITLAB_LABELS
    listed = await k.json("kustomizations.kustomize.toolkit.fluxcd.io", "-l",
                          "app.gitlab.com/project_id=1,app.gitlab.com/environment_slug=production")
    assert [item["metadata"]["name"] for item in listed["items"]] == ["app"]
    # Flux's printer columns read the Ready condition
    assert table_rows(await k.out("get", "ks", "app"))[1][2:] == ["False", ready["message"]]
    # "reconcile now" annotates the object; the status stays, and a status sent to the main
    # resource is ignored, as with every status subresource
    await k("annotate", "kustomization/app", "reconcile.fluxcd.io/requestedAt=2026-01-02T03:05:00Z")
    await k("patch", "kustomization/app", "--type=merge", "-p", json.dumps({"status": {"conditions": []}}))
    obj = await k.json("kustomization/app")
    assert obj["metadata"]["annotations"]["reconcile.fluxcd.io/requestedAt"] == "2026-01-02T03:05:00Z"
    assert obj["status"]["conditions"] == [ready] and obj["metadata"]["generation"] == 1


async def test_job_failure_and_suspension_shapes(k: K) -> None:
    await k.create({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "broken"}, "spec": {
        "backoffLimit": 0, "template": {"metadata": {"annotations": {"kubesim.io/fail": "true"}}, "spec": {
            "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox:1.36"}]}}}})
    job = await k.wait_until("job/broken", lambda j: any(
        c["type"] == "Failed" for c in (j.get("status") or {}).get("conditions") or []))
    assert [(c["type"], c["status"], c["reason"], c["message"]) for c in job["status"]["conditions"]] == [
        ("FailureTarget", "True", "BackoffLimitExceeded", "Job has reached the specified backoff limit"),
        ("Failed", "True", "BackoffLimitExceeded", "Job has reached the specified backoff limit")]
    assert all(c["lastProbeTime"] and c["lastTransitionTime"] for c in job["status"]["conditions"])
    assert job["status"]["failed"] == 1 and "active" not in job["status"] and "completionTime" not in job["status"]
    assert job["status"]["ready"] == 0 and job["status"]["terminating"] == 0
    assert ("Warning", "BackoffLimitExceeded") in [(e["type"], e["reason"]) for e in await k.events("broken")]

    await k.create({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "held"}, "spec": {
        "suspend": True, "template": {"spec": {"restartPolicy": "Never",
                                               "containers": [{"name": "c", "image": "busybox:1.36"}]}}}})
    job = await k.wait_until("job/held", lambda j: (j.get("status") or {}).get("conditions"))
    [suspended] = job["status"]["conditions"]
    assert (suspended["type"], suspended["status"], suspended["reason"], suspended["message"]) == (
        "Suspended", "True", "JobSuspended", "Job suspended")
    assert "startTime" not in job["status"] and "active" not in job["status"]
    assert (await k.json("pods", "-l", "job-name=held"))["items"] == []
    await k("patch", "job/held", "--type=merge", "-p", '{"spec":{"suspend":false}}')
    job = await k.wait_until("job/held", lambda j: j["status"].get("startTime"))
    assert (_condition(job, "Suspended")["status"], _condition(job, "Suspended")["reason"]) == ("False", "JobResumed")
    assert [e["reason"] for e in await k.events("held")][:2] == ["Suspended", "Resumed"]

    await k.create({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "nightly"}, "spec": {
        "schedule": "* * * * *", "suspend": True, "jobTemplate": {"spec": {"template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox:1.36"}]}}}}}})
    await k.advance(61)
    cronjob = await k.json("cronjob/nightly")
    assert cronjob["spec"]["suspend"] is True and cronjob.get("status", {}) == {}
    assert table_rows(await k.out("get", "cronjob", "nightly"))[1][3] == "True"  # SUSPEND
    assert not [j for j in (await k.json("jobs"))["items"] if j["metadata"]["name"].startswith("nightly-")]


async def test_hello_manifest_is_an_environment(k: K) -> None:
    await k("apply", "-f", str(REPO / "examples" / "manifests" / "hello.yaml"))
    selector = "app.gitlab.com/project_id=1,app.gitlab.com/environment_slug=production"
    labelled = await k.json("deployments,replicasets,pods,services,ingresses,configmaps,cronjobs", "-l", selector)
    kinds = sorted({item["kind"] for item in labelled["items"]})
    assert kinds == ["ConfigMap", "CronJob", "Deployment", "Ingress", "Pod", "ReplicaSet", "Service"]
    await k.advance(3)  # the template's kubesim.io/ready-after
    dep = await k.wait_until("deployment/hello", lambda d: d["status"].get("availableReplicas") == 2)
    assert _condition(dep, "Progressing")["reason"] == "NewReplicaSetAvailable"
    pod = (await k.json("pods", "-l", "app=hello"))["items"][0]["metadata"]["name"]
    greeting = await k.out("exec", pod, "--", "cat", "/etc/hello/greeting")
    assert greeting == "hello from the cluster behind agentd"
    ingress = await k.wait_until("ingress/hello", lambda i: i["status"]["loadBalancer"].get("ingress"))
    assert ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]["name"] == "hello"
    await k("create", "job", "report-now", "--from=cronjob/hello-report")
    await k("wait", "--for=condition=Complete", "job/report-now", "--timeout=15s")
    assert await k.out("logs", "job/report-now") == "report: hello from the cluster behind agentd\n"
