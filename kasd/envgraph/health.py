"""The health of one object, in Argo CD's words and by Argo CD's built-in rules.

Sources the rules were checked against (read, not copied): argoproj/gitops-engine ``pkg/health``
(Deployment, StatefulSet, DaemonSet, ReplicaSet, Pod, Service, Ingress, PVC, Job, HPA, APIService,
and the "Pending deletion" rule of ``GetResourceHealth``), Argo CD's ``resource_customizations``
(``batch/CronJob/health.lua``, ``kustomize.toolkit.fluxcd.io/Kustomization/health.lua`` for the Flux
objects), and kstatus (kubernetes-sigs/cli-utils ``pkg/kstatus/status/generic.go``) for any other
object that speaks its conditions. docs/environments.md, "The graph and health", has every rule as a
table.

Deliberate departures from those sources:

- Robustness: Argo converts to typed objects and answers Unknown with the conversion error; here a
  field of the wrong type reads as absent, and only a rule that cannot decide (an HPA v1 conditions
  annotation that is not JSON) answers Unknown, naming what it could not read.
- Messages: where Argo's message is empty but the status is not Healthy, a short one is given
  instead (the load balancer not assigned yet, the container a crash-looping pod waits on when the
  kubelet gave no message, the container and reason of a last termination, the scheduler's message
  for a pending pod it could not place), so a roll-up can say why. Every message is cut at ``MAX_MESSAGE`` characters. Argo's CronJob typo ("succesfully") is
  spelled right.
- Pod: a pod without ``spec.restartPolicy`` is read as ``Always`` (the API server's default; Argo
  would answer Unknown for a running one). Init containers that wait on an error (``Init:
  CrashLoopBackOff``, an init image that cannot be pulled) degrade the pod as its containers do;
  Argo reads only the containers, so such a pod stays Pending, Progressing, for ever.
- Job: the ``Complete``/``Failed``/``Suspended`` conditions count only when their status is
  ``"True"`` (Argo counts a ``Suspended=False`` condition, left on a resumed job, as completion, so a
  resumed job that is running reads Healthy; here it reads Progressing). A suspended job's message is
  its condition's message (Argo gives the empty failure message).
- Flux (``*.toolkit.fluxcd.io``): Argo's script needs both ``Ready=Unknown`` and
  ``Reconciling=True`` for Progressing and calls anything else not Ready Degraded; here, as Flux and
  kstatus define the conditions, ``Stalled=True`` is Degraded, ``Reconciling=True`` or
  ``Ready=Unknown`` (or an unobserved generation) is Progressing, ``Ready=False`` is Degraded; the
  message is the condition's reason and message.
- kstatus for other objects: kstatus itself reads only ``Reconciling``/``Stalled`` and the observed
  generation; a ``Ready`` condition is read too (``False`` → Degraded, ``Unknown`` → Progressing),
  as Argo's scripts for such resources (Flux, cert-manager) do.
- Namespace: Argo has no rule; a terminating one (``status.phase`` Terminating, or a deletion
  timestamp) is Progressing.
- Argo Workflows (``argoproj.io/Workflow``) get no special rule; they fall to the kstatus reading.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

import attrs

from kasd.envgraph.identity import group_version, mapping, seq, text

__all__ = [
    "DEGRADED",
    "HEALTHY",
    "MAX_MESSAGE",
    "MISSING",
    "PROGRESSING",
    "SEVERITY",
    "STATUSES",
    "SUSPENDED",
    "UNKNOWN",
    "Health",
    "health_of",
]

HEALTHY = "Healthy"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
SUSPENDED = "Suspended"
MISSING = "Missing"
UNKNOWN = "Unknown"

# Argo's healthOrder: most healthy first; the roll-up is the last one present.
SEVERITY: tuple[str, ...] = (HEALTHY, SUSPENDED, PROGRESSING, MISSING, DEGRADED, UNKNOWN)
STATUSES = frozenset(SEVERITY)

MAX_MESSAGE = 512  # characters of one object's message (a pod's status message has no limit)


@attrs.frozen
class Health:
    """One verdict: ``status`` is one of ``STATUSES``; ``message`` says why (may be empty)."""

    status: str
    message: str = ""

    def to_json(self) -> dict[str, str]:
        return {"status": self.status, "message": self.message}


class _Unreadable(Exception):
    """A rule met a field it cannot decide on; the object's health is Unknown with this message."""


def _cut(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 1] + "…"


def _int(value: object) -> int:
    """A count as Go reads a missing one: 0 (and so is a bool or a string)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _opt_int(value: object) -> int | None:
    """A pointer field (``spec.replicas``): None when absent."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _conditions(status: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [mapping(c) for c in seq(status.get("conditions")) if isinstance(c, Mapping)]


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in _conditions(status):
        if cond.get("type") == kind:
            return cond
    return None


def _reason_message(cond: Mapping[str, Any]) -> str:
    reason, message = text(cond.get("reason")), text(cond.get("message"))
    if reason and message:
        return f"{reason}: {message}"
    return reason or message


# -- apps ------------------------------------------------------------------------------------------


def _deployment(obj: Mapping[str, Any]) -> Health:
    spec, status = mapping(obj.get("spec")), mapping(obj.get("status"))
    if spec.get("paused") is True:
        return Health(SUSPENDED, "Deployment is paused")
    if _int(mapping(obj.get("metadata")).get("generation")) > _int(status.get("observedGeneration")):
        return Health(PROGRESSING, "Waiting for rollout to finish: observed deployment generation "
                                   "less than desired generation")
    progressing = _condition(status, "Progressing")
    replicas = _opt_int(spec.get("replicas"))
    updated = _int(status.get("updatedReplicas"))
    if progressing is not None and progressing.get("reason") == "ProgressDeadlineExceeded":
        name = text(mapping(obj.get("metadata")).get("name"))
        return Health(DEGRADED, f'Deployment "{name}" exceeded its progress deadline')
    if replicas is not None and updated < replicas:
        return Health(PROGRESSING, f"Waiting for rollout to finish: {updated} out of {replicas} "
                                   "new replicas have been updated...")
    total = _int(status.get("replicas"))
    if total > updated:
        return Health(PROGRESSING, f"Waiting for rollout to finish: {total - updated} old replicas "
                                   "are pending termination...")
    available = _int(status.get("availableReplicas"))
    if available < updated:
        return Health(PROGRESSING, f"Waiting for rollout to finish: {available} of {updated} "
                                   "updated replicas are available...")
    return Health(HEALTHY)


def _statefulset(obj: Mapping[str, Any]) -> Health:
    spec, status = mapping(obj.get("spec")), mapping(obj.get("status"))
    observed = _int(status.get("observedGeneration"))
    if observed == 0 or _int(mapping(obj.get("metadata")).get("generation")) > observed:
        return Health(PROGRESSING, "Waiting for statefulset spec update to be observed...")
    replicas = _opt_int(spec.get("replicas"))
    ready = _int(status.get("readyReplicas"))
    if replicas is not None and ready < replicas:
        return Health(PROGRESSING, f"Waiting for {replicas - ready} pods to be ready...")
    strategy = mapping(spec.get("updateStrategy"))
    updated = _int(status.get("updatedReplicas"))
    rolling = strategy.get("rollingUpdate")
    if strategy.get("type") == "RollingUpdate" and isinstance(rolling, Mapping):
        partition = _opt_int(rolling.get("partition"))
        if replicas is not None and partition is not None and updated < replicas - partition:
            return Health(PROGRESSING, "Waiting for partitioned roll out to finish: "
                                       f"{updated} out of {replicas - partition} new pods have been updated...")
        return Health(HEALTHY, f"partitioned roll out complete: {updated} new pods have been updated...")
    if strategy.get("type") == "OnDelete":
        return Health(HEALTHY, f"statefulset has {ready} ready pods")
    update_rev, current_rev = text(status.get("updateRevision")), text(status.get("currentRevision"))
    if update_rev != current_rev:
        return Health(PROGRESSING, f"waiting for statefulset rolling update to complete {updated} "
                                   f"pods at revision {update_rev}...")
    return Health(HEALTHY, f"statefulset rolling update complete {_int(status.get('currentReplicas'))} "
                           f"pods at revision {current_rev}...")


def _daemonset(obj: Mapping[str, Any]) -> Health:
    spec, status = mapping(obj.get("spec")), mapping(obj.get("status"))
    meta = mapping(obj.get("metadata"))
    if _int(meta.get("generation")) > _int(status.get("observedGeneration")):
        return Health(PROGRESSING, "Waiting for rollout to finish: observed daemon set generation "
                                   "less than desired generation")
    updated = _int(status.get("updatedNumberScheduled"))
    desired = _int(status.get("desiredNumberScheduled"))
    if mapping(spec.get("updateStrategy")).get("type") == "OnDelete":
        return Health(HEALTHY, f"daemon set {updated} out of {desired} new pods have been updated")
    name = text(meta.get("name"))
    if updated < desired:
        return Health(PROGRESSING, f'Waiting for daemon set "{name}" rollout to finish: {updated} '
                                   f"out of {desired} new pods have been updated...")
    available = _int(status.get("numberAvailable"))
    if available < desired:
        return Health(PROGRESSING, f'Waiting for daemon set "{name}" rollout to finish: '
                                   f"{available} of {desired} updated pods are available...")
    return Health(HEALTHY)


def _replicaset(obj: Mapping[str, Any]) -> Health:
    spec, status = mapping(obj.get("spec")), mapping(obj.get("status"))
    if _int(mapping(obj.get("metadata")).get("generation")) > _int(status.get("observedGeneration")):
        return Health(PROGRESSING, "Waiting for rollout to finish: observed replica set generation "
                                   "less than desired generation")
    failure = _condition(status, "ReplicaFailure")
    if failure is not None and failure.get("status") == "True":
        return Health(DEGRADED, text(failure.get("message")))
    replicas = _opt_int(spec.get("replicas"))
    available = _int(status.get("availableReplicas"))
    if replicas is not None and available < replicas:
        return Health(PROGRESSING, f"Waiting for rollout to finish: {available} out of {replicas} "
                                   "new replicas are available...")
    return Health(HEALTHY)


# -- core ------------------------------------------------------------------------------------------


def _failing_wait(reason: str) -> bool:
    # Argo's net for a container that will not start: ErrImagePull, CreateContainerConfigError,
    # RunContainerError, CrashLoopBackOff, ImagePullBackOff... (not InvalidImageName: as in Argo,
    # that pod stays Pending, so Progressing)
    return reason.startswith("Err") or reason.endswith(("Error", "BackOff"))


def _terminated_message(ctr: Mapping[str, Any]) -> str:
    term = mapping(mapping(ctr.get("state")).get("terminated"))
    if not term:
        return ""
    if text(term.get("message")):
        return text(term.get("message"))
    if term.get("reason") == "OOMKilled":
        return "OOMKilled"
    code = _int(term.get("exitCode"))
    if code != 0:
        return f'container "{text(ctr.get("name"))}" failed with exit code {code}'
    return ""


def _pod(obj: Mapping[str, Any]) -> Health:
    spec, status = mapping(obj.get("spec")), mapping(obj.get("status"))
    policy = text(spec.get("restartPolicy")) or "Always"
    containers = [mapping(c) for c in seq(status.get("containerStatuses"))]
    pod_message = text(status.get("message"))
    if policy == "Always":
        # Argo leaves finite pods (hooks) alone here: a bad image there must not fail a hook early.
        waits = []
        for ctr in [mapping(c) for c in seq(status.get("initContainerStatuses"))] + containers:
            waiting = mapping(mapping(ctr.get("state")).get("waiting"))
            reason = text(waiting.get("reason"))
            if waiting and _failing_wait(reason):
                waits.append(text(waiting.get("message"))
                             or f'container "{text(ctr.get("name"))}": {reason}')
        if waits:
            return Health(DEGRADED, ", ".join(waits))
    phase = status.get("phase")
    if phase == "Pending":
        unscheduled = _condition(status, "PodScheduled")
        if not pod_message and unscheduled is not None and unscheduled.get("status") == "False":
            pod_message = text(unscheduled.get("message"))  # the scheduler's why ("Insufficient cpu")
        return Health(PROGRESSING, pod_message)
    if phase == "Succeeded":
        return Health(HEALTHY, pod_message)
    if phase == "Failed":
        if pod_message:
            return Health(DEGRADED, pod_message)
        for ctr in [mapping(c) for c in seq(status.get("initContainerStatuses"))] + containers:
            if message := _terminated_message(ctr):
                return Health(DEGRADED, message)
        return Health(DEGRADED, "")
    if phase == "Running":
        if policy != "Always":
            # a pod that runs to completion (a hook, a job's) is on its way, not yet healthy
            return Health(PROGRESSING, pod_message)
        ready = _condition(status, "Ready")
        if ready is not None and ready.get("status") == "True":
            return Health(HEALTHY, pod_message)
        for ctr in containers:
            last = mapping(mapping(ctr.get("lastState")).get("terminated"))
            if last:
                return Health(DEGRADED, pod_message or (
                    f'container "{text(ctr.get("name"))}" last terminated: '
                    f'{text(last.get("reason")) or "exit"} (exit code {_int(last.get("exitCode"))})'))
        return Health(PROGRESSING, pod_message)
    return Health(UNKNOWN, pod_message)


def _service(obj: Mapping[str, Any]) -> Health:
    if mapping(obj.get("spec")).get("type") == "LoadBalancer":
        return _load_balanced(obj, "load balancer")
    return Health(HEALTHY)


def _load_balanced(obj: Mapping[str, Any], what: str) -> Health:
    if seq(mapping(mapping(obj.get("status")).get("loadBalancer")).get("ingress")):
        return Health(HEALTHY)
    return Health(PROGRESSING, f"Waiting for the {what} to be assigned an address")


def _ingress(obj: Mapping[str, Any]) -> Health:
    return _load_balanced(obj, "ingress")


def _pvc(obj: Mapping[str, Any]) -> Health:
    phase = mapping(obj.get("status")).get("phase")
    status = {"Lost": DEGRADED, "Pending": PROGRESSING, "Bound": HEALTHY}.get(text(phase), UNKNOWN)
    return Health(status)


def _namespace(obj: Mapping[str, Any]) -> Health:
    if mapping(obj.get("status")).get("phase") == "Terminating":
        return Health(PROGRESSING, "Namespace is terminating")
    return Health(HEALTHY)


# -- batch -----------------------------------------------------------------------------------------


def _job(obj: Mapping[str, Any]) -> Health:
    failed: Mapping[str, Any] | None = None
    complete: Mapping[str, Any] | None = None
    suspended: Mapping[str, Any] | None = None
    for cond in _conditions(mapping(obj.get("status"))):
        if cond.get("status") != "True":
            continue
        kind = cond.get("type")
        if kind == "Failed":
            failed = cond
        elif kind == "Complete":
            complete = cond
        elif kind == "Suspended":
            suspended = cond
    if failed is not None:
        return Health(DEGRADED, text(failed.get("message")))
    if suspended is not None:
        return Health(SUSPENDED, text(suspended.get("message")))
    if complete is not None:
        return Health(HEALTHY, text(complete.get("message")))
    return Health(PROGRESSING)


def _timestamp(value: str) -> datetime | str:
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return value


def _earlier(a: str, b: str) -> bool:
    ta, tb = _timestamp(a), _timestamp(b)
    if isinstance(ta, datetime) and isinstance(tb, datetime) and (ta.tzinfo is None) == (tb.tzinfo is None):
        return ta < tb
    return a < b  # RFC 3339 strings of one writer compare as their times (Argo's Lua compares these)


def _cronjob(obj: Mapping[str, Any]) -> Health:
    if mapping(obj.get("spec")).get("suspend") is True:
        return Health(SUSPENDED, "CronJob is Suspended")
    raw_status = obj.get("status")
    if not isinstance(raw_status, Mapping):
        return Health(PROGRESSING, "Waiting for CronJob")
    scheduled = text(raw_status.get("lastScheduleTime"))
    if not scheduled:
        return Health(HEALTHY, "CronJob has not been scheduled yet")
    succeeded = text(raw_status.get("lastSuccessfulTime"))
    if not succeeded:
        return Health(HEALTHY, "The Cronjob never completed successfully. It may not be healthy")
    if seq(raw_status.get("active")):
        return Health(HEALTHY, "The job is running. Its last execution may not have been successful")
    if _earlier(succeeded, scheduled):
        return Health(DEGRADED, "CronJob has not completed its last execution successfully")
    return Health(HEALTHY, "CronJob has completed its last execution successfully")


# -- autoscaling, apiregistration ------------------------------------------------------------------

_HPA_DEGRADED = frozenset({
    ("AbleToScale", "FailedGetScale"),
    ("AbleToScale", "FailedUpdateScale"),
    ("ScalingActive", "FailedGetResourceMetric"),
    ("ScalingActive", "InvalidSelector"),
})
_HPA_WAITING = Health(PROGRESSING, "Waiting to Autoscale")


def _hpa(obj: Mapping[str, Any]) -> Health:
    _group, version = group_version(text(obj.get("apiVersion")))
    conditions: Iterable[Mapping[str, Any]]
    if version == "v1":
        raw = mapping(mapping(obj.get("metadata")).get("annotations")).get(
            "autoscaling.alpha.kubernetes.io/conditions")
        if not isinstance(raw, str):
            return _HPA_WAITING
        try:
            decoded = json.loads(raw)
        except ValueError as e:
            raise _Unreadable(f"failed to read the conditions annotation: {e}") from None
        conditions = [mapping(c) for c in seq(decoded)]
    else:
        conditions = _conditions(mapping(obj.get("status")))
    for cond in conditions:
        if (cond.get("type"), cond.get("reason")) in _HPA_DEGRADED:
            return Health(DEGRADED, text(cond.get("message")))
        if cond.get("type") in ("AbleToScale", "ScalingLimited") and cond.get("status") == "True":
            return Health(HEALTHY, text(cond.get("message")))
    return _HPA_WAITING


def _apiservice(obj: Mapping[str, Any]) -> Health:
    available = _condition(mapping(obj.get("status")), "Available")
    if available is None:
        return Health(PROGRESSING, "Waiting to be processed")
    message = f"{text(available.get('reason'))}: {text(available.get('message'))}"
    return Health(HEALTHY if available.get("status") == "True" else PROGRESSING, message)


# -- Flux and kstatus ------------------------------------------------------------------------------


def _unobserved(obj: Mapping[str, Any]) -> Health | None:
    """kstatus: a generation the controller has not seen yet is in progress (when it reports one)."""
    observed = mapping(obj.get("status")).get("observedGeneration")
    generation = mapping(obj.get("metadata")).get("generation")
    if _opt_int(observed) is None or _opt_int(generation) is None or observed == generation:
        return None
    return Health(PROGRESSING, f"{text(obj.get('kind'))} generation is {generation}, "
                               f"but latest observed generation is {observed}")


def _conditioned(obj: Mapping[str, Any], *, default: Health) -> Health:
    """The kstatus conditions (and Ready) of ``obj``; ``default`` when none of them decides."""
    if (unobserved := _unobserved(obj)) is not None:
        return unobserved
    status = mapping(obj.get("status"))
    stalled = _condition(status, "Stalled")
    if stalled is not None and stalled.get("status") == "True":
        return Health(DEGRADED, _reason_message(stalled))
    reconciling = _condition(status, "Reconciling")
    if reconciling is not None and reconciling.get("status") == "True":
        return Health(PROGRESSING, _reason_message(reconciling))
    ready = _condition(status, "Ready")
    if ready is not None:
        verdict = {"True": HEALTHY, "False": DEGRADED}.get(text(ready.get("status")), PROGRESSING)
        return Health(verdict, _reason_message(ready))
    return default


def _flux(obj: Mapping[str, Any]) -> Health:
    if mapping(obj.get("spec")).get("suspend") is True:
        return Health(SUSPENDED, f"{text(obj.get('kind'))} is suspended")
    return _conditioned(obj, default=Health(PROGRESSING, "Status unknown"))


def _generic(obj: Mapping[str, Any]) -> Health:
    return _conditioned(obj, default=Health(HEALTHY))


_Rule = Callable[[Mapping[str, Any]], Health]

_RULES: dict[tuple[str, str], _Rule] = {
    ("apps", "Deployment"): _deployment,
    ("apps", "StatefulSet"): _statefulset,
    ("apps", "DaemonSet"): _daemonset,
    ("apps", "ReplicaSet"): _replicaset,
    ("", "Pod"): _pod,
    ("", "Service"): _service,
    ("", "PersistentVolumeClaim"): _pvc,
    ("", "Namespace"): _namespace,
    ("networking.k8s.io", "Ingress"): _ingress,
    ("extensions", "Ingress"): _ingress,
    ("batch", "Job"): _job,
    ("batch", "CronJob"): _cronjob,
    ("autoscaling", "HorizontalPodAutoscaler"): _hpa,
    ("apiregistration.k8s.io", "APIService"): _apiservice,
}


def _rule(group: str, kind: str) -> _Rule:
    if (rule := _RULES.get((group, kind))) is not None:
        return rule
    if group.endswith(".toolkit.fluxcd.io"):
        return _flux
    return _generic


def health_of(obj: Mapping[str, Any]) -> Health:
    """The health of one object that is present in the cluster (Missing is for what is not)."""
    meta = mapping(obj.get("metadata"))
    if text(meta.get("deletionTimestamp")):
        finalizers = [text(f) for f in seq(meta.get("finalizers")) if text(f)]
        blocked = f"; blocked by finalizers: {', '.join(finalizers)}" if finalizers else ""
        return Health(PROGRESSING, _cut(f"Pending deletion{blocked}"))
    group, _version = group_version(text(obj.get("apiVersion")))
    try:
        health = _rule(group, text(obj.get("kind")))(obj)
    except _Unreadable as e:
        return Health(UNKNOWN, _cut(str(e)))
    return health if len(health.message) <= MAX_MESSAGE else Health(health.status, _cut(health.message))
