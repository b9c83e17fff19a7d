"""Simple controllers that make objects behave: workloads make pods, pods run, statuses fill in.

This module holds the loop and the small controllers (node, namespaces, endpoint slices, HPAs,
PVCs); `cluster` holds the state and the writes they all share, `workloads` Deployments,
ReplicaSets, StatefulSets, DaemonSets and Jobs, `cronjobs` the CronJob controller, and `kubelet`
the pod lifecycle and container consoles. Those three take the `cluster.Cluster` they act on and
import nothing of this module, which calls them.

`Controllers.run` wakes on every store change (and on a short tick, for things that happen with
time) and reconciles everything until nothing changes. Pods become Running and Ready at once,
unless a knob on the pod (usually set through the pod template's annotations) says otherwise:

- `kubesim.io/crash-loop: "true"`: the container keeps exiting with code 1; the pod shows
  `CrashLoopBackOff` and its restart count grows.
- `kubesim.io/stall-rollout: "true"`: the pod runs but never becomes Ready, so a rollout of a
  template carrying it stalls (and hits its progress deadline).
- `kubesim.io/fail: "true"`: a Job's pod exits with code 1 (the Job then fails).
- `kubesim.io/oom-kill: "true"`: the container is OOMKilled (exit code 137) and crash-loops.
- `kubesim.io/ready-after: "3s"`: the pod runs, and is Ready that long after its containers started.
- an image on a registry host under `.invalid` cannot be pulled (`ErrImagePull`, `ImagePullBackOff`).

Services of type LoadBalancer and Ingresses get an address in `status.loadBalancer.ingress` at once,
or `kubesim.io/load-balancer-after` (a Go duration, or `"never"`) after their creation.
"""

from __future__ import annotations

import copy
import math
import time
from functools import partial
from typing import Any

import trio

from kubesim import cronjobs, kubelet, workloads
from kubesim.cluster import NODE_IP, NODE_NAME, Cluster
from kubesim.errors import ApiError
from kubesim.objects import owner_ref, pod_ready
from kubesim.selectors import selector_from_match_labels
from kubesim.store import Store
from kubesim.timefmt import Clock, now, parse, rfc3339, using

#: seconds a reconcile must take before the loop batches the changes that follow it, and the
#: longest it then waits for more (a small store, as in tests, is settled at once after each change)
BATCH_AFTER = 0.005
BATCH_MAX = 0.05

#: the annotation that delays (or, with "never", withholds) a load balancer's address
LOAD_BALANCER_AFTER = "kubesim.io/load-balancer-after"
#: the address the cluster's ingress controller publishes on every Ingress (its own LoadBalancer's)
INGRESS_IP = "172.18.255.200"

ROOT_CA = "-----BEGIN CERTIFICATE-----\nMIIBkubesimkubesimkubesim\n-----END CERTIFICATE-----\n"


class Controllers(Cluster):
    """The reconcilers' loop over the `Cluster` they act on, and the small reconcilers."""

    def __init__(self, store: Store, *, tick: float = 0.5, root_ca: bytes | None = None,
                 restart_backoff: tuple[float, float] = (10.0, 300.0),
                 clock: Clock | None = None) -> None:
        super().__init__(store, restart_backoff=restart_backoff, clock=clock)
        self.tick = tick
        # What every namespace's kube-root-ca.crt ConfigMap carries: the serving CA when known.
        self.root_ca = root_ca.decode() if root_ca else ROOT_CA
        # The run loop's wait for a change or a deadline (`poke` ends it early).
        self._waiting: trio.CancelScope | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            try:
                self.reconcile()
                task_status.started()
                seen = self.store.resource_version
                cost = 0.0
                while True:
                    deadline = min(trio.current_time() + (self.tick if self.timed_work else math.inf),
                                   self.wake_at)
                    with trio.move_on_at(deadline) as self._waiting:
                        await self.store.wait_changed(seen)
                    self._waiting = None
                    if cost >= BATCH_AFTER:
                        # Passes have become costly (a large store): the writes arriving while we
                        # wait as long as the last one took join the next, so a client writing
                        # many objects one by one costs a pass per batch, not per object.
                        await trio.sleep(min(cost, BATCH_MAX))
                    started = time.perf_counter()
                    self.reconcile()
                    cost = time.perf_counter() - started
                    seen = self.store.resource_version
                    await trio.lowlevel.checkpoint()
            finally:
                self.nursery = None

    # -- the loop ------------------------------------------------------------------------------

    def poke(self) -> None:
        """Make the run loop pass now and recompute when to wake (the clock moved)."""
        if self._waiting is not None:
            self._waiting.cancel()

    def reconcile(self) -> None:
        self.timed_work = False
        self.wake_at = math.inf
        with using(self.clock):
            for _ in range(50):
                before = self.store.resource_version
                self._pass()
                if self.store.resource_version == before:
                    return

    def _pass(self) -> None:
        self._ensure_node()
        for plural, step in (
            ("namespaces", self._namespace), ("deployments", partial(workloads.deployment, self)),
            ("replicasets", partial(workloads.replicaset, self)),
            ("statefulsets", partial(workloads.statefulset, self)),
            ("daemonsets", partial(workloads.daemonset, self)),
            ("cronjobs", partial(cronjobs.cronjob, self)), ("jobs", partial(workloads.job, self)),
            ("pods", partial(kubelet.pod, self)),
            ("services", self._service), ("ingresses", self._ingress),
            ("horizontalpodautoscalers", self._hpa),
            ("persistentvolumeclaims", self._pvc),
        ):
            kind = self.kinds[plural]
            # Steps get the live objects and must copy before changing anything: copying
            # every object on every pass would make large stores slow.
            for obj in list(self.store.iter_objects(kind.group, plural)):
                try:
                    step(obj)
                except ApiError:
                    # Raced with a deletion (a namespace going away, …): the next pass settles it.
                    continue
        kubelet.close_stale_consoles(self)

    # -- cluster furniture ---------------------------------------------------------------------

    def _ensure_node(self) -> None:
        kind = self.kinds["nodes"]
        if self.store.exists(kind, None, NODE_NAME):
            return
        node = self.store.create(kind, None, {"metadata": {"name": NODE_NAME, "labels": {
            "kubernetes.io/hostname": NODE_NAME, "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64", "node-role.kubernetes.io/control-plane": ""}},
            "spec": {"podCIDR": "10.244.0.0/24"}})
        stamp = rfc3339(now())
        status = {
            "capacity": {"cpu": "8", "memory": "16Gi", "pods": "110"},
            "allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "kubelet is posting ready status",
                            "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}],
            "addresses": [{"type": "InternalIP", "address": NODE_IP},
                          {"type": "Hostname", "address": NODE_NAME}],
            "nodeInfo": {"kubeletVersion": "v1.32.0", "kubeProxyVersion": "v1.32.0",
                         "osImage": "kubesim", "kernelVersion": "6.0.0-kubesim",
                         "containerRuntimeVersion": "kubesim://1.0", "operatingSystem": "linux",
                         "architecture": "amd64"},
        }
        self.set_status("nodes", node, status)

    def _namespace(self, ns: dict[str, Any]) -> None:
        if ns["metadata"].get("deletionTimestamp"):
            return
        name = ns["metadata"]["name"]
        if not self.store.exists(self.kinds["serviceaccounts"], name, "default"):
            self.store.create(self.kinds["serviceaccounts"], name, {"metadata": {"name": "default"}})
        if not self.store.exists(self.kinds["configmaps"], name, "kube-root-ca.crt"):
            self.store.create(self.kinds["configmaps"], name, {
                "metadata": {"name": "kube-root-ca.crt", "annotations": {
                    "kubernetes.io/description": "Contains a CA bundle that can be used to verify "
                    "the kube-apiserver when using internal endpoints such as the internal "
                    "service IP or kubernetes.default.svc. No other usage is guaranteed across "
                    "distributions of Kubernetes clusters."}},
                "data": {"ca.crt": self.root_ca}})
        if name == "default" and not self.store.exists(self.kinds["services"], "default", "kubernetes"):
            self.store.create(self.kinds["services"], "default", {
                "metadata": {"name": "kubernetes", "labels": {"component": "apiserver", "provider": "kubernetes"}},
                "spec": {"clusterIP": "10.96.0.1", "ports": [
                    {"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]}})

    # -- services, scaling, storage ------------------------------------------------------------

    def _load_balancer_due(self, obj: dict[str, Any]) -> bool:
        """Whether the simulated load balancer has an address for `obj` by now
        (`kubesim.io/load-balancer-after`: a Go duration after its creation, or "never")."""
        text = (obj["metadata"].get("annotations") or {}).get(LOAD_BALANCER_AFTER)
        if text is None:
            return True
        if text.strip().lower() == "never":
            return False
        delay = kubelet.parse_go_duration(text)
        created = parse(obj["metadata"].get("creationTimestamp"))
        if delay is None or created is None:
            return True
        remaining = delay - (now() - created).total_seconds()
        if remaining <= 0:
            return True
        self.timed_work = True
        if _in_trio():
            self.wake_by(trio.current_time() + remaining)
        return False

    def _load_balancer(self, svc: dict[str, Any]) -> None:
        """The cloud's service controller: a LoadBalancer Service gets an external address."""
        spec = svc.get("spec") or {}
        status = svc.get("status") or {}
        ingress = (status.get("loadBalancer") or {}).get("ingress")
        if spec.get("type") != "LoadBalancer":
            if ingress:  # no longer a load balancer: the cloud's is deleted
                self.set_status("services", svc, {**status, "loadBalancer": {}})
            return
        if ingress or not self._load_balancer_due(svc):
            return
        kind = self.kinds["services"]
        self.event(kind, svc, "EnsuringLoadBalancer", "Ensuring load balancer", component="service-controller")
        address = self.store.allocator.load_balancer_ip()
        self.set_status("services", svc, {**status, "loadBalancer": {
            "ingress": [{"ip": address, "ipMode": "VIP"}]}})
        self.event(kind, svc, "EnsuredLoadBalancer", "Ensured load balancer", component="service-controller")

    def _ingress(self, ing: dict[str, Any]) -> None:
        """The ingress controller (one, behind the cluster's ingress address) publishes its address."""
        status = ing.get("status") or {}
        if ((status.get("loadBalancer") or {}).get("ingress")) or not self._load_balancer_due(ing):
            return
        self.set_status("ingresses", ing, {**status, "loadBalancer": {"ingress": [{"ip": INGRESS_IP}]}})

    def _service(self, svc: dict[str, Any]) -> None:
        self._load_balancer(svc)
        svc = self.store.peek(self.kinds["services"], svc["metadata"]["namespace"], svc["metadata"]["name"]) or svc
        meta, spec = svc["metadata"], svc.get("spec") or {}
        selector = spec.get("selector")
        if not selector:
            return
        ns = meta["namespace"]
        eps_kind = self.kinds["endpointslices"]
        endpoints = []
        # Candidates: the pods with the selector's first label (an index), then the whole selector.
        first_key, first_value = next(iter(sorted(selector.items())))
        candidates = self.labelled("pods", ns, str(first_key), str(first_value))
        slices = self.owned("endpointslices", ns, meta["uid"])
        fingerprint = (meta.get("resourceVersion"), *sorted(p["metadata"].get("resourceVersion", "") for p in candidates),
                       *sorted(e["metadata"].get("resourceVersion", "") for e in slices))
        if self.settled(meta["uid"], fingerprint):
            return
        matches = selector_from_match_labels({"matchLabels": selector})
        for pod in sorted(candidates, key=lambda p: p["metadata"]["name"]):
            ip = (pod.get("status") or {}).get("podIP")
            if not ip or not matches(pod) or pod["metadata"].get("deletionTimestamp"):
                continue
            ready = pod_ready(pod)
            endpoints.append({
                "addresses": [ip],
                "conditions": {"ready": ready, "serving": ready, "terminating": False},
                "nodeName": NODE_NAME,
                "targetRef": {"kind": "Pod", "name": pod["metadata"]["name"], "namespace": ns,
                              "uid": pod["metadata"]["uid"]},
            })
        ports = []
        for port in spec.get("ports") or []:
            target = port.get("targetPort", port.get("port"))
            entry = {"name": port.get("name", ""), "protocol": port.get("protocol", "TCP"),
                     "port": target if isinstance(target, int) else port.get("port")}
            ports.append(entry)
        existing = next((e for e in slices
                         if (e["metadata"].get("labels") or {}).get("kubernetes.io/service-name") == meta["name"]), None)
        body = {"addressType": "IPv4", "endpoints": endpoints, "ports": ports}
        if existing is None:
            self.store.create(eps_kind, ns, {
                "metadata": {"generateName": f"{meta['name']}-", "labels": {
                    "kubernetes.io/service-name": meta["name"],
                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
                    "ownerReferences": [owner_ref(self.kinds["services"], svc)]},
                **body})
        elif any(existing.get(k) != v for k, v in body.items()):
            existing = {**copy.deepcopy(existing), **body}
            self.update("endpointslices", existing)
        self.settle(meta["uid"], fingerprint)

    def _hpa(self, hpa: dict[str, Any]) -> None:
        spec = hpa.get("spec") or {}
        ref = spec.get("scaleTargetRef") or {}
        target = None
        if ref.get("kind") == "Deployment":
            target = self.store.find(self.kinds["deployments"], hpa["metadata"]["namespace"], ref.get("name", ""))
        current = ((target or {}).get("status") or {}).get("replicas", 0)
        desired = min(max(current, spec.get("minReplicas", 1)), spec.get("maxReplicas", current or 1))
        status = copy.deepcopy(hpa.get("status") or {})
        status.update({"currentReplicas": current, "desiredReplicas": desired})
        self.set_status("horizontalpodautoscalers", hpa, status)

    def _pvc(self, pvc: dict[str, Any]) -> None:
        status = pvc.get("status") or {}
        if status.get("phase") == "Bound":
            return
        spec = pvc.get("spec") or {}
        if not spec.get("volumeName"):
            pvc = copy.deepcopy(pvc)
            pvc["spec"]["volumeName"] = f"pvc-{pvc['metadata']['uid']}"
            self.update("persistentvolumeclaims", pvc)
            pvc = self.store.get(self.kinds["persistentvolumeclaims"], pvc["metadata"]["namespace"], pvc["metadata"]["name"])
        storage = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
        self.set_status("persistentvolumeclaims", pvc, {
            "phase": "Bound", "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
            "capacity": {"storage": storage}})


def _in_trio() -> bool:
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True
