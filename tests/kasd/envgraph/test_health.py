"""health_of over object shapes as the API server answers them (``kubectl get -o json``), one
fixture per case in ``shapes/``. The ones named after a state kubesim reaches were taken from kubesim
(``python -m kubesim`` + ``kubectl apply`` + ``kubectl get -o json``); the others are such an object
with the fields that make the case changed to what a real cluster shows then. Expected words are
Argo CD's (gitops-engine ``pkg/health``, Argo CD's resource_customizations), or the departure named
in ``kasd/envgraph/health.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kasd.envgraph import (
    DEGRADED,
    HEALTHY,
    PROGRESSING,
    STATUSES,
    SUSPENDED,
    UNKNOWN,
    Health,
    health_of,
)
from kasd.envgraph.health import MAX_MESSAGE

pytestmark = pytest.mark.timeout(30)

SHAPES = Path(__file__).parent / "shapes"


def shape(case: str) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads((SHAPES / f"{case}.json").read_text(encoding="utf-8"))
    return obj


CASES = [
    ("apiservice-available", HEALTHY, "Passed: all checks passed"),
    ("apiservice-not-processed", PROGRESSING, "Waiting to be processed"),
    ("apiservice-unavailable", PROGRESSING, "FailedDiscoveryCheck: failing or missing response from https://10.96.0.20:443/apis/metrics.k8s.io/v1beta1: Get \"https://10.96.0.20:443/apis/metrics.k8s.io/v1beta1\": dial tcp 10.96.0.20:443: connect: connection refused"),
    ("configmap", HEALTHY, ""),
    ("cronjob-last-run-failed", DEGRADED, "CronJob has not completed its last execution successfully"),
    ("cronjob-last-run-succeeded", HEALTHY, "CronJob has completed its last execution successfully"),
    ("cronjob-never-succeeded", HEALTHY, "The Cronjob never completed successfully. It may not be healthy"),
    ("cronjob-no-status", PROGRESSING, "Waiting for CronJob"),
    ("cronjob-not-scheduled-yet", HEALTHY, "CronJob has not been scheduled yet"),
    ("cronjob-running", HEALTHY, "The job is running. Its last execution may not have been successful"),
    ("cronjob-suspended", SUSPENDED, "CronJob is Suspended"),
    ("custom-resource-without-status", HEALTHY, ""),
    ("daemonset-generation-not-observed", PROGRESSING, "Waiting for rollout to finish: observed daemon set generation less than desired generation"),
    ("daemonset-ondelete", HEALTHY, "daemon set 1 out of 3 new pods have been updated"),
    ("daemonset-pods-unavailable", PROGRESSING, "Waiting for daemon set \"agent\" rollout to finish: 2 of 3 updated pods are available..."),
    ("daemonset-rolled-out", HEALTHY, ""),
    ("daemonset-rolling", PROGRESSING, "Waiting for daemon set \"agent\" rollout to finish: 2 out of 3 new pods have been updated..."),
    ("deployment-available", HEALTHY, ""),
    ("deployment-generation-not-observed", PROGRESSING, "Waiting for rollout to finish: observed deployment generation less than desired generation"),
    ("deployment-new-replicas-updating", PROGRESSING, "Waiting for rollout to finish: 1 out of 2 new replicas have been updated..."),
    ("deployment-old-replicas-terminating", PROGRESSING, "Waiting for rollout to finish: 1 old replicas are pending termination..."),
    ("deployment-paused", SUSPENDED, "Deployment is paused"),
    ("deployment-progress-deadline-exceeded", DEGRADED, "Deployment \"stalled\" exceeded its progress deadline"),
    ("deployment-updated-not-available", PROGRESSING, "Waiting for rollout to finish: 0 of 1 updated replicas are available..."),
    ("endpointslice", HEALTHY, ""),
    ("flux-gitrepository-fetch-failed", DEGRADED, "GitOperationFailed: failed to checkout and determine revision: unable to clone 'https://gitlab.example/group/app.git': authentication required"),
    ("flux-helmrelease-stalled", DEGRADED, "RetriesExceeded: Failed to install after 1 attempt(s)"),
    ("flux-kustomization-build-failed", DEGRADED, "BuildFailed: kustomize build failed: accumulating resources: open /tmp/kustomization-1/deploy/production/missing.yaml: no such file or directory"),
    ("flux-kustomization-generation-not-observed", PROGRESSING, "Kustomization generation is 3, but latest observed generation is 2"),
    ("flux-kustomization-no-conditions", PROGRESSING, "Status unknown"),
    ("flux-kustomization-ready", HEALTHY, "ReconciliationSucceeded: Applied revision: main@sha1:5e3d7f1c"),
    ("flux-kustomization-reconciling", PROGRESSING, "Progressing: Reconciliation in progress"),
    ("flux-kustomization-suspended", SUSPENDED, "Kustomization is suspended"),
    ("hpa-v1-annotation-able-to-scale", HEALTHY, "the HPA controller was able to get the target's current scale"),
    ("hpa-v1-annotation-not-json", UNKNOWN, "failed to read the conditions annotation: Expecting property name enclosed in double quotes: line 1 column 3 (char 2)"),
    ("hpa-v1-no-annotation", PROGRESSING, "Waiting to Autoscale"),
    ("hpa-v2-able-to-scale", HEALTHY, "recommended size matches current size"),
    ("hpa-v2-failed-get-resource-metric", DEGRADED, "the HPA was unable to compute the replica count: failed to get cpu utilization: missing request for cpu in container web of Pod hello-r762dkrkm9-6frdq"),
    ("hpa-v2-no-conditions", PROGRESSING, "Waiting to Autoscale"),
    ("ingress-no-address", PROGRESSING, "Waiting for the ingress to be assigned an address"),
    ("ingress-with-address", HEALTHY, ""),
    ("job-complete", HEALTHY, "Reached expected number of succeeded pods"),
    ("job-failed-backoff-limit", DEGRADED, "Job has reached the specified backoff limit"),
    ("job-resumed-running", PROGRESSING, ""),
    ("job-running", PROGRESSING, ""),
    ("job-suspended", SUSPENDED, "Job suspended"),
    ("kstatus-certificate-not-ready", DEGRADED, "DoesNotExist: Issuing certificate as Secret does not exist"),
    ("kstatus-certificate-ready", HEALTHY, "Ready: Certificate is up to date and has not expired"),
    ("kstatus-generation-not-observed", PROGRESSING, "Widget generation is 5, but latest observed generation is 4"),
    ("kstatus-reconciling", PROGRESSING, "ScalingUp: 2 of 3 widgets made"),
    ("kstatus-stalled", DEGRADED, "QuotaExceeded: cannot make widget 3: quota exceeded"),
    ("namespace-active", HEALTHY, ""),
    ("namespace-terminating-phase-only", PROGRESSING, "Namespace is terminating"),
    ("namespace-terminating", PROGRESSING, "Pending deletion"),
    ("persistentvolume", HEALTHY, ""),
    ("pod-crashloopbackoff", DEGRADED, "back-off restarting failed container"),
    ("pod-createcontainerconfigerror", DEGRADED, "configmap \"app-settings\" not found"),
    ("pod-errimagepull", DEGRADED, "failed to pull and unpack image \"registry.example/app:nope\": not found"),
    ("pod-evicted", DEGRADED, "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. "),
    ("pod-failed-exit-code", DEGRADED, "container \"m\" failed with exit code 1"),
    ("pod-failed-oomkilled", DEGRADED, "OOMKilled"),
    ("pod-imagepullbackoff-restart-never", PROGRESSING, ""),
    ("pod-init-crashloopbackoff", DEGRADED, "back-off restarting failed container"),
    ("pod-imagepullbackoff", DEGRADED, "Back-off pulling image \"registry.example/app:nope\""),
    ("pod-pending-container-creating", PROGRESSING, ""),
    ("pod-pending-unschedulable", PROGRESSING, "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."),
    ("pod-phase-unknown", UNKNOWN, ""),
    ("pod-running-last-oomkilled", DEGRADED, "container \"app\" last terminated: OOMKilled (exit code 137)"),
    ("pod-running-not-ready", PROGRESSING, ""),
    ("pod-running-ready", HEALTHY, ""),
    ("pod-running-restart-never", PROGRESSING, ""),
    ("pod-running-restart-onfailure", PROGRESSING, ""),
    ("pod-succeeded", HEALTHY, ""),
    ("pod-terminating", PROGRESSING, "Pending deletion"),
    ("pvc-bound", HEALTHY, ""),
    ("pvc-lost", DEGRADED, ""),
    ("pvc-pending", PROGRESSING, ""),
    ("replicaset-available", HEALTHY, ""),
    ("replicaset-generation-not-observed", PROGRESSING, "Waiting for rollout to finish: observed replica set generation less than desired generation"),
    ("replicaset-not-available", PROGRESSING, "Waiting for rollout to finish: 0 out of 1 new replicas are available..."),
    ("replicaset-replica-failure", DEGRADED, "pods \"crashy-rtnxqws6ds-\" is forbidden: exceeded quota: compute, requested: cpu=2, used: cpu=8, limited: cpu=8"),
    ("service-clusterip", HEALTHY, ""),
    ("service-loadbalancer-assigned", HEALTHY, ""),
    ("service-loadbalancer-pending", PROGRESSING, "Waiting for the load balancer to be assigned an address"),
    ("serviceaccount", HEALTHY, ""),
    ("statefulset-generation-not-observed", PROGRESSING, "Waiting for statefulset spec update to be observed..."),
    ("statefulset-ondelete", HEALTHY, "statefulset has 1 ready pods"),
    ("statefulset-partitioned-rolling", PROGRESSING, "Waiting for partitioned roll out to finish: 1 out of 2 new pods have been updated..."),
    ("statefulset-pods-not-ready", PROGRESSING, "Waiting for 2 pods to be ready..."),
    ("statefulset-revision-rolling", PROGRESSING, "waiting for statefulset rolling update to complete 0 pods at revision db-6c5b7d9f8..."),
    ("statefulset-rolled-out", HEALTHY, "partitioned roll out complete: 1 new pods have been updated..."),
]


@pytest.mark.parametrize(("case", "status", "message"), CASES, ids=[c[0] for c in CASES])
def test_health_of_shape(case: str, status: str, message: str) -> None:
    assert health_of(shape(case)) == Health(status, message)


def test_every_shape_is_in_the_table() -> None:
    """A fixture added without its verdict would test nothing."""
    on_disk = {p.stem for p in SHAPES.glob("*.json")} - {"kubesim-prod-environment"}
    assert on_disk == {c[0] for c in CASES}


def test_a_failing_wait_on_any_container_degrades_with_each_message() -> None:
    pod = shape("pod-crashloopbackoff")
    second = json.loads(json.dumps(pod["status"]["containerStatuses"][0]))
    second.update(name="sidecar", state={"waiting": {"reason": "ImagePullBackOff"}})
    pod["status"]["containerStatuses"].append(second)
    assert health_of(pod) == Health(
        DEGRADED, 'back-off restarting failed container, container "sidecar": ImagePullBackOff')


def test_a_pending_pod_the_scheduler_cannot_place_says_why() -> None:
    assert health_of(shape("pod-pending-unschedulable")).message.startswith(
        "0/1 nodes are available: 1 Insufficient cpu.")


def test_deletion_names_the_finalizers_that_hold_it() -> None:
    ks = shape("flux-kustomization-ready")
    ks["metadata"]["deletionTimestamp"] = "2026-11-27T17:00:00Z"
    assert health_of(ks) == Health(PROGRESSING, "Pending deletion; blocked by finalizers: finalizers.fluxcd.io")


def test_a_huge_message_is_cut() -> None:
    pod = shape("pod-evicted")
    pod["status"]["message"] = "x" * 100_000
    health = health_of(pod)
    assert health.status == DEGRADED and len(health.message) == MAX_MESSAGE and health.message.endswith("…")


def test_a_job_pod_that_runs_is_progressing_not_healthy() -> None:
    """Argo: a pod that runs to completion is on its way while it runs."""
    assert health_of(shape("pod-running-restart-never")).status == PROGRESSING


def test_a_suspended_flux_object_is_suspended_whatever_its_conditions() -> None:
    hr = shape("flux-helmrelease-stalled")
    hr["spec"]["suspend"] = True
    assert health_of(hr) == Health(SUSPENDED, "HelmRelease is suspended")


def test_a_pod_without_restart_policy_reads_as_always() -> None:
    pod = shape("pod-running-ready")
    del pod["spec"]["restartPolicy"]
    assert health_of(pod).status == HEALTHY


def test_cronjob_times_compare_as_times_not_strings() -> None:
    cj = shape("cronjob-last-run-failed")
    cj["status"] = {"lastScheduleTime": "2026-11-27T03:00:00Z", "lastSuccessfulTime": "2026-11-27T03:00:00.5Z"}
    assert health_of(cj).status == HEALTHY


# -- never raises, whatever the cluster sends ------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8)
    | st.sampled_from(["True", "False", "Always", "Running", "Pending", "Failed", "RollingUpdate",
                       "LoadBalancer", "Ready", "Stalled", "Reconciling", "CrashLoopBackOff", "OOMKilled"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["status", "spec", "metadata", "conditions", "type", "reason", "message",
                         "containerStatuses", "state", "waiting", "lastState", "terminated", "phase",
                         "replicas", "generation", "observedGeneration", "paused", "suspend",
                         "loadBalancer", "ingress", "updateStrategy", "rollingUpdate", "partition",
                         "annotations", "deletionTimestamp", "lastScheduleTime", "active"]),
        inner, max_size=5),
    max_leaves=20)
_kinds = st.sampled_from([
    ("apps/v1", "Deployment"), ("apps/v1", "StatefulSet"), ("apps/v1", "DaemonSet"),
    ("apps/v1", "ReplicaSet"), ("v1", "Pod"), ("v1", "Service"), ("v1", "PersistentVolumeClaim"),
    ("v1", "Namespace"), ("networking.k8s.io/v1", "Ingress"), ("batch/v1", "Job"),
    ("batch/v1", "CronJob"), ("autoscaling/v1", "HorizontalPodAutoscaler"),
    ("autoscaling/v2", "HorizontalPodAutoscaler"), ("apiregistration.k8s.io/v1", "APIService"),
    ("kustomize.toolkit.fluxcd.io/v1", "Kustomization"), ("example.com/v1", "Widget")])


@settings(max_examples=50, deadline=None)
@given(kind=_kinds, body=st.dictionaries(st.sampled_from(["metadata", "spec", "status"]), _json))
def test_health_of_any_object_is_a_verdict(kind: tuple[str, str], body: dict[str, Any]) -> None:
    health = health_of({"apiVersion": kind[0], "kind": kind[1], **body})
    assert health.status in STATUSES
    assert len(health.message) <= MAX_MESSAGE


def test_unknown_is_a_verdict_too() -> None:
    assert health_of(shape("hpa-v1-annotation-not-json")).status == UNKNOWN
