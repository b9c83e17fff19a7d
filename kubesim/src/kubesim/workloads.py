"""Workload controllers: Deployment → ReplicaSet → Pods, StatefulSets, DaemonSets and Jobs,
with the status fields `kubectl rollout status`, `kubectl wait` and `kubectl get` read."""

from __future__ import annotations

import copy
from typing import Any

from kubesim.cluster import NODE_NAME, Cluster
from kubesim.objects import condition, owner_ref, percent, pod_ready, template_hash
from kubesim.resources import Kind
from kubesim.timefmt import now, parse, rfc3339


def pods_of(ctl: Cluster, owner: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in ctl.owned("pods", owner["metadata"]["namespace"], owner["metadata"]["uid"])
            if not p["metadata"].get("deletionTimestamp")]

def new_pod(ctl: Cluster, owner_kind: Kind, owner: dict[str, Any], template: dict[str, Any], *,
             name: str = "", generate_name: str = "", extra_labels: dict[str, str] | None = None,
             hostname: str = "") -> dict[str, Any]:
    meta = copy.deepcopy(template.get("metadata") or {})
    meta.pop("name", None)
    if name:
        meta["name"] = name
    else:
        meta["generateName"] = generate_name
    meta["labels"] = {**(meta.get("labels") or {}), **(extra_labels or {})}
    meta["ownerReferences"] = [owner_ref(owner_kind, owner)]
    spec = copy.deepcopy(template.get("spec") or {})
    if hostname:
        spec.setdefault("hostname", hostname)
    pod = ctl.store.create(ctl.kinds["pods"], owner["metadata"]["namespace"],
                            {"metadata": meta, "spec": spec})
    return pod

def deployment(ctl: Cluster, dep: dict[str, Any]) -> None:
    meta, spec = dep["metadata"], dep.get("spec") or {}
    ns, uid = meta["namespace"], meta["uid"]
    kind, rs_kind = ctl.kinds["deployments"], ctl.kinds["replicasets"]
    desired = int(spec.get("replicas", 1))
    template = spec.get("template") or {}
    pod_hash = ctl.template_hashes.get((uid, meta.get("generation", 1)))
    if pod_hash is None:
        if len(ctl.template_hashes) > 10_000:
            ctl.template_hashes.clear()
        pod_hash = ctl.template_hashes[(uid, meta.get("generation", 1))] = template_hash(template)
    owned = ctl.owned("replicasets", ns, uid)  # live: copy before changing one
    fingerprint = (meta.get("resourceVersion"), *sorted(rs["metadata"].get("resourceVersion", "") for rs in owned))
    if ctl.settled(uid, fingerprint):
        return
    new_rs = next((rs for rs in owned
                   if (rs["metadata"].get("labels") or {}).get("pod-template-hash") == pod_hash), None)
    revisions = [int((rs["metadata"].get("annotations") or {}).get("deployment.kubernetes.io/revision", "0"))
                 for rs in owned]
    max_surge = percent((spec.get("strategy", {}).get("rollingUpdate") or {}).get("maxSurge", "25%"), desired, round_up=True)
    annotations = {"deployment.kubernetes.io/desired-replicas": str(desired),
                   "deployment.kubernetes.io/max-replicas": str(desired + max_surge)}
    if spec.get("paused"):
        return
    if new_rs is None:
        revision = max(revisions, default=0) + 1
        labels = {**((template.get("metadata") or {}).get("labels") or {}), "pod-template-hash": pod_hash}
        rs_template = copy.deepcopy(template)
        rs_template.setdefault("metadata", {})["labels"] = labels
        selector = copy.deepcopy(spec.get("selector") or {})
        selector.setdefault("matchLabels", {})["pod-template-hash"] = pod_hash
        new_rs = ctl.store.create(rs_kind, ns, {
            "metadata": {"name": f"{meta['name']}-{pod_hash}", "labels": labels,
                         "annotations": {**annotations, "deployment.kubernetes.io/revision": str(revision)},
                         "ownerReferences": [owner_ref(kind, dep)]},
            "spec": {"replicas": desired, "selector": selector, "template": rs_template,
                     "minReadySeconds": spec.get("minReadySeconds", 0)},
        })
        ctl.event(kind, dep, "ScalingReplicaSet",
                   f"Scaled up replica set {new_rs['metadata']['name']} from 0 to {desired}",
                   component="deployment-controller")
    else:
        live_annotations = new_rs["metadata"].get("annotations") or {}
        current_revision = int(live_annotations.get("deployment.kubernetes.io/revision", "0"))
        wanted_revision = current_revision if current_revision == max(revisions, default=0) else max(revisions) + 1
        if new_rs["spec"].get("replicas") != desired or current_revision != wanted_revision or any(
                live_annotations.get(k) != v for k, v in annotations.items()):
            new_rs = copy.deepcopy(new_rs)
            rs_annotations = new_rs["metadata"].setdefault("annotations", {})
            old_count = new_rs["spec"].get("replicas")
            new_rs["spec"]["replicas"] = desired
            rs_annotations.update(annotations)
            rs_annotations["deployment.kubernetes.io/revision"] = str(wanted_revision)
            ctl.update("replicasets", new_rs)
            if old_count != desired:
                verb = "up" if desired > (old_count or 0) else "down"
                ctl.event(kind, dep, "ScalingReplicaSet",
                           f"Scaled {verb} replica set {new_rs['metadata']['name']} from {old_count} to {desired}",
                           component="deployment-controller")
        new_rs = ctl.store.peek(rs_kind, ns, new_rs["metadata"]["name"]) or new_rs
    new_status = new_rs.get("status") or {}
    new_ready = new_status.get("readyReplicas", 0)
    stalled = False
    for rs in owned:
        if rs["metadata"]["uid"] == new_rs["metadata"]["uid"]:
            continue
        if new_ready >= desired and rs["spec"].get("replicas", 0) != 0:
            old_count = rs["spec"].get("replicas", 0)
            rs = copy.deepcopy(rs)
            rs["spec"]["replicas"] = 0
            ctl.update("replicasets", rs)
            ctl.event(kind, dep, "ScalingReplicaSet",
                       f"Scaled down replica set {rs['metadata']['name']} from {old_count} to 0",
                       component="deployment-controller")
        elif new_ready < desired:
            stalled = True
    all_rs = [live for rs in owned if (live := ctl.store.peek(rs_kind, ns, rs["metadata"]["name"])) is not None]
    if all(rs["metadata"]["uid"] != new_rs["metadata"]["uid"] for rs in all_rs):
        all_rs.append(new_rs)
    replicas = sum((rs.get("status") or {}).get("replicas", 0) for rs in all_rs)
    ready = sum((rs.get("status") or {}).get("readyReplicas", 0) for rs in all_rs)
    available = sum((rs.get("status") or {}).get("availableReplicas", 0) for rs in all_rs)
    updated = new_status.get("replicas", 0)
    max_unavailable = percent((spec.get("strategy", {}).get("rollingUpdate") or {}).get("maxUnavailable", "25%"), desired, round_up=False)
    old_status = dep.get("status") or {}
    old_conditions = old_status.get("conditions") or []
    stamp = rfc3339(now())
    rs_name = new_rs["metadata"]["name"]
    if available >= desired - max_unavailable:
        available_condition = condition("Available", "True", "MinimumReplicasAvailable",
                                         "Deployment has minimum availability.", old_conditions,
                                         stamp=stamp, update_time=True)
    else:
        available_condition = condition("Available", "False", "MinimumReplicasUnavailable",
                                         "Deployment does not have minimum availability.",
                                         old_conditions, stamp=stamp, update_time=True)
    complete = updated == desired and replicas == desired and available >= desired and new_ready >= desired
    previous = next((c for c in old_conditions if c.get("type") == "Progressing"), None)
    if complete:
        progressing = condition("Progressing", "True", "NewReplicaSetAvailable",
                                 f'ReplicaSet "{rs_name}" has successfully progressed.',
                                 old_conditions, stamp=stamp, update_time=True)
    else:
        ctl.timed_work = True
        started = parse((previous or {}).get("lastUpdateTime")) if previous and previous.get("reason") in ("ReplicaSetUpdated", "NewReplicaSetCreated", "ProgressDeadlineExceeded") else None
        deadline = spec.get("progressDeadlineSeconds", 600)
        timed_out = started is not None and (now() - started).total_seconds() > deadline
        if timed_out or (previous and previous.get("reason") == "ProgressDeadlineExceeded"):
            progressing = condition("Progressing", "False", "ProgressDeadlineExceeded",
                                     f'ReplicaSet "{rs_name}" has timed out progressing.',
                                     old_conditions, stamp=stamp, update_time=True)
        else:
            progressing = condition("Progressing", "True", "ReplicaSetUpdated",
                                     f'ReplicaSet "{rs_name}" is progressing.',
                                     old_conditions, stamp=stamp, update_time=True)
            if previous and previous.get("reason") == "ReplicaSetUpdated":
                progressing["lastUpdateTime"] = previous.get("lastUpdateTime", stamp)
    del stalled
    status: dict[str, Any] = {"observedGeneration": meta.get("generation", 1)}
    if replicas:
        status["replicas"] = replicas
    if updated:
        status["updatedReplicas"] = updated
    if ready:
        status["readyReplicas"] = ready
    if available:
        status["availableReplicas"] = available
    if replicas - available > 0:
        status["unavailableReplicas"] = replicas - available
    status["conditions"] = [available_condition, progressing]
    ctl.set_status("deployments", dep, status)
    # Complete: nothing changes until it or its ReplicaSets do. Else time matters (the deadline).
    ctl.settle(uid, fingerprint if complete else None)

def replicaset(ctl: Cluster, rs: dict[str, Any]) -> None:
    meta, spec = rs["metadata"], rs.get("spec") or {}
    kind = ctl.kinds["replicasets"]
    desired = int(spec.get("replicas", 1))
    pods = pods_of(ctl, rs)
    fingerprint = (meta.get("resourceVersion"), *sorted(p["metadata"].get("resourceVersion", "") for p in pods))
    if ctl.settled(meta["uid"], fingerprint):
        return
    template = spec.get("template") or {}
    for _ in range(max(0, desired - len(pods))):
        pod = new_pod(ctl, kind, rs, template, generate_name=f"{meta['name']}-")
        pods.append(pod)
        ctl.event(kind, rs, "SuccessfulCreate", f"Created pod: {pod['metadata']['name']}",
                   component="replicaset-controller")
    if len(pods) > desired:
        # Newest and not-ready pods go first, as the ReplicaSet controller ranks them.
        newest_first = sorted(pods, key=lambda p: p["metadata"]["creationTimestamp"], reverse=True)
        doomed = sorted(newest_first, key=pod_ready)
        for pod in doomed[: len(pods) - desired]:
            ctl.store.delete(ctl.kinds["pods"], meta["namespace"], pod["metadata"]["name"])
            ctl.event(kind, rs, "SuccessfulDelete", f"Deleted pod: {pod['metadata']['name']}",
                       component="replicaset-controller")
        pods = pods_of(ctl, rs)
    ready = sum(1 for p in pods if pod_ready(p))
    status: dict[str, Any] = {"replicas": len(pods), "observedGeneration": meta.get("generation", 1)}
    if pods:
        status["fullyLabeledReplicas"] = len(pods)
    if ready:
        status["readyReplicas"] = ready
        status["availableReplicas"] = ready
    ctl.set_status("replicasets", rs, status)
    ctl.settle(meta["uid"], fingerprint)

def statefulset(ctl: Cluster, sts: dict[str, Any]) -> None:
    meta, spec = sts["metadata"], sts.get("spec") or {}
    kind = ctl.kinds["statefulsets"]
    ns, name = meta["namespace"], meta["name"]
    desired = int(spec.get("replicas", 1))
    template = spec.get("template") or {}
    revision = f"{name}-{template_hash(template)}"
    pods = {p["metadata"]["name"]: p for p in pods_of(ctl, sts)}
    for index in range(desired):
        pod_name = f"{name}-{index}"
        pod = pods.get(pod_name)
        if pod is not None and (pod["metadata"].get("labels") or {}).get("controller-revision-hash") != revision:
            ctl.store.delete(ctl.kinds["pods"], ns, pod_name)
            pod = None
        if pod is None and not ctl.store.exists(ctl.kinds["pods"], ns, pod_name):
            new_pod(ctl, kind, sts, template, name=pod_name, hostname=pod_name, extra_labels={
                "controller-revision-hash": revision,
                "statefulset.kubernetes.io/pod-name": pod_name,
                "apps.kubernetes.io/pod-index": str(index)})
            ctl.event(kind, sts, "SuccessfulCreate",
                       f"create Pod {pod_name} in StatefulSet {name} successful",
                       component="statefulset-controller")
    for pod_name in pods:
        index = int(pod_name.rsplit("-", 1)[-1]) if pod_name.rsplit("-", 1)[-1].isdigit() else -1
        if index >= desired or index < 0:
            ctl.store.delete(ctl.kinds["pods"], ns, pod_name)
    pods_now = pods_of(ctl, sts)
    ready = sum(1 for p in pods_now if pod_ready(p))
    updated = sum(1 for p in pods_now if (p["metadata"].get("labels") or {}).get("controller-revision-hash") == revision)
    status: dict[str, Any] = {
        "observedGeneration": meta.get("generation", 1), "replicas": len(pods_now),
        "currentReplicas": updated, "updatedReplicas": updated,
        "currentRevision": revision, "updateRevision": revision, "collisionCount": 0,
    }
    if ready:
        status["readyReplicas"] = ready
    status["availableReplicas"] = ready
    ctl.set_status("statefulsets", sts, status)

def daemonset(ctl: Cluster, ds: dict[str, Any]) -> None:
    meta, spec = ds["metadata"], ds.get("spec") or {}
    kind = ctl.kinds["daemonsets"]
    template = spec.get("template") or {}
    revision = template_hash(template)
    pods = pods_of(ctl, ds)
    for pod in pods:
        if (pod["metadata"].get("labels") or {}).get("controller-revision-hash") != revision:
            ctl.store.delete(ctl.kinds["pods"], meta["namespace"], pod["metadata"]["name"])
    pods = pods_of(ctl, ds)
    if not pods:
        template = copy.deepcopy(template)
        template.setdefault("spec", {})["nodeName"] = NODE_NAME
        pod = new_pod(ctl, kind, ds, template, generate_name=f"{meta['name']}-", extra_labels={
            "controller-revision-hash": revision,
            "pod-template-generation": str(meta.get("generation", 1))})
        ctl.event(kind, ds, "SuccessfulCreate", f"Created pod: {pod['metadata']['name']}",
                   component="daemonset-controller")
        pods = [pod]
    ready = sum(1 for p in pods if pod_ready(p))
    status = {"currentNumberScheduled": 1, "desiredNumberScheduled": 1, "numberMisscheduled": 0,
              "numberReady": ready, "observedGeneration": meta.get("generation", 1),
              "updatedNumberScheduled": 1, "numberAvailable": ready}
    if not ready:
        status["numberUnavailable"] = 1
        del status["numberAvailable"]
    ctl.set_status("daemonsets", ds, status)

def job(ctl: Cluster, job: dict[str, Any]) -> None:
    meta, spec = job["metadata"], job.get("spec") or {}
    kind = ctl.kinds["jobs"]
    status = copy.deepcopy(job.get("status") or {})
    conditions = status.get("conditions") or []
    if any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions):
        return
    stamp = rfc3339(now())
    suspended = bool(spec.get("suspend"))
    was_suspended = any(c.get("type") == "Suspended" and c.get("status") == "True" for c in conditions)
    if suspended != was_suspended and (suspended or was_suspended):
        # The Job controller's Suspended condition (JobSuspended / JobResumed) and its event.
        reason, message = ("JobSuspended", "Job suspended") if suspended else ("JobResumed", "Job resumed")
        entry = condition("Suspended", "True" if suspended else "False", reason, message, conditions, stamp=stamp)
        entry["lastProbeTime"] = stamp
        status["conditions"] = [c for c in conditions if c.get("type") != "Suspended"] + [entry]
        ctl.event(kind, job, "Suspended" if suspended else "Resumed", message, component="job-controller")
    if suspended:
        status.pop("startTime", None)  # a suspended Job has not started (it restarts its clock on resume)
    else:
        status.setdefault("startTime", stamp)
    completions = int(spec.get("completions", 1) or 1)
    parallelism = int(spec.get("parallelism", 1))
    uid = meta["uid"]
    all_pods = ctl.owned("pods", meta["namespace"], uid)
    succeeded = sum(1 for p in all_pods if (p.get("status") or {}).get("phase") == "Succeeded")
    failed = sum(1 for p in all_pods if (p.get("status") or {}).get("phase") == "Failed")
    active = [p for p in all_pods if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
    backoff = int(spec.get("backoffLimit", 6))
    # With restartPolicy OnFailure a pod's failures are its containers' restarts, which count
    # against backoffLimit as the Job controller's pastBackoffLimitOnFailure counts them.
    restarts = sum(entry.get("restartCount", 0) for p in active
                   for entry in (p.get("status") or {}).get("containerStatuses") or [])
    on_failure = ((spec.get("template") or {}).get("spec") or {}).get("restartPolicy") == "OnFailure"
    past_limit = failed > backoff or (on_failure and (restarts > 0 if backoff == 0 else restarts >= backoff))
    if not spec.get("suspend") and not past_limit:
        wanted = min(parallelism, completions - succeeded) - len(active)
        for _ in range(max(0, wanted)):
            pod = new_pod(ctl, kind, job, spec.get("template") or {},
                                generate_name=f"{meta['name']}-")
            ctl.event(kind, job, "SuccessfulCreate", f"Created pod: {pod['metadata']['name']}",
                       component="job-controller")
            active.append(pod)
    status["active"] = len(active)
    status["ready"] = sum(1 for p in active if pod_ready(p))
    status["terminating"] = 0
    if succeeded:
        status["succeeded"] = succeeded
    if failed:
        status["failed"] = failed
    status["uncountedTerminatedPods"] = {}
    if not active:
        status.pop("active")
    if succeeded >= completions:
        status.pop("active", None)
        status["completionTime"] = stamp
        status["conditions"] = [*_suspension(status),
            condition("SuccessCriteriaMet", "True", "CompletionsReached",
                       "Reached expected number of succeeded pods", None, stamp=stamp),
            condition("Complete", "True", "CompletionsReached",
                       "Reached expected number of succeeded pods", None, stamp=stamp),
        ]
        for entry in status["conditions"][-2:]:
            entry["lastProbeTime"] = stamp
        ctl.event(kind, job, "Completed", "Job completed", component="job-controller")
    elif past_limit:
        status.pop("active", None)
        for pod in active:  # the Job controller deletes what still runs
            if ctl.store.exists(ctl.kinds["pods"], meta["namespace"], pod["metadata"]["name"]):
                ctl.store.delete(ctl.kinds["pods"], meta["namespace"], pod["metadata"]["name"])
            status["failed"] = status.get("failed", 0) + 1
        status["conditions"] = [*_suspension(status),
            condition("FailureTarget", "True", "BackoffLimitExceeded",
                       "Job has reached the specified backoff limit", None, stamp=stamp),
            condition("Failed", "True", "BackoffLimitExceeded",
                       "Job has reached the specified backoff limit", None, stamp=stamp),
        ]
        for entry in status["conditions"][-2:]:
            entry["lastProbeTime"] = stamp
        ctl.event(kind, job, "BackoffLimitExceeded", "Job has reached the specified backoff limit",
                   component="job-controller", type_="Warning")
    ctl.set_status("jobs", job, status)


def _suspension(status: dict[str, Any]) -> list[dict[str, Any]]:
    """The Job's Suspended condition, which stays when it finishes."""
    return [c for c in status.get("conditions") or [] if c.get("type") == "Suspended"]
