"""What the controllers share: the store and its kinds, the clock, the one node, the containers
the kubelet runs (their processes, consoles and filesystems), the pods' network, and the writes
every controller makes (a status, an update, an event).

`controllers.Controllers` is the `Cluster` with the loop and the small reconcilers; `workloads`,
`cronjobs` and `kubelet` are reconcilers that take the `Cluster` they act on, so none of them
imports the loop that calls them.
"""

from __future__ import annotations

import abc
import copy
import itertools
import math
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import attrs
import trio

from kubesim.console import ContainerConsole
from kubesim.errors import ApiError
from kubesim.fs import FileSystem
from kubesim.netsim import Network
from kubesim.processes import MainProcess
from kubesim.resources import Kind
from kubesim.store import Store
from kubesim.timefmt import Clock, now, rfc3339

#: The one node every pod is scheduled to, and its address.
NODE_NAME = "kubesim-node"
NODE_IP = "172.18.0.2"

_EVENT_IDS = itertools.count(time.time_ns())


@attrs.define
class ImagePull:
    """The kubelet's image back-off for one container: its failed pulls of `image` so far."""
    image: str
    failures: int
    failed_at: datetime
    retry_at: datetime


class Cluster(abc.ABC):
    """The state the reconcilers read and write, and the consoles of the containers they started."""

    def __init__(self, store: Store, *, restart_backoff: tuple[float, float] = (10.0, 300.0),
                 clock: Clock | None = None) -> None:
        self.store = store
        # The server's clock: reconcile reads it even when called from outside the server's tasks.
        self.clock = clock or Clock()
        # The kubelet's crash-loop back-off: first delay, doubling up to the second.
        self.restart_backoff = restart_backoff
        # Containers' main processes run here (set by `run`; without it, containers idle).
        self.nursery: trio.Nursery | None = None
        self.processes: dict[tuple[str, str, str], MainProcess] = {}
        self.previous_consoles: dict[tuple[str, str, str], ContainerConsole] = {}
        self.backoffs: dict[tuple[str, str, str], float] = {}
        # Containers whose image cannot be pulled: when each failed and may be tried again.
        self.image_pulls: dict[tuple[str, str, str], ImagePull] = {}
        # The images the node has pulled (an `IfNotPresent` container then finds them there).
        self.node_images: set[str] = set()
        # What listens in each pod (port-forward connects through it; `httpd` listens on it).
        self.network = Network()
        # The earliest trio time some pass asked to be woken at (a container's restart).
        self.wake_at = math.inf
        self.consoles: dict[tuple[str, str, str], ContainerConsole] = {}
        # Each running container's filesystem (a fresh one per run, as a new writable layer).
        self.filesystems: dict[tuple[str, str, str], FileSystem] = {}
        # Pods whose volumes cannot be mounted yet: the `FailedMount` message last recorded.
        self.mount_failures: dict[tuple[str, str], str] = {}
        # Set by a pass that saw work which happens with time (crash loops, progress deadlines):
        # only then does `run` wake on the tick as well as on changes.
        self.timed_work = False
        # Each Deployment's pod-template hash by (uid, generation): a template changes only with
        # the generation, and hashing it on every pass is costly.
        self.template_hashes: dict[tuple[str, int], str] = {}
        # Each recorded event's identity → its name, so a repeat raises its count (`event`).
        self._event_keys: dict[tuple[str, ...], str] = {}
        # Per object uid, the inputs its reconciler last settled it with (`settled`).
        self._settled: dict[str, tuple[Any, ...]] = {}
        self._owner_index: dict[str, tuple[int, dict[tuple[str, str], list[dict[str, Any]]]]] = {}
        self._label_index: dict[str, tuple[int, dict[tuple[str, str, str], list[dict[str, Any]]]]] = {}
        self.kinds = {plural: store.kind(group, plural) for group, plural in (
            ("", "pods"), ("", "namespaces"), ("", "nodes"), ("", "events"), ("", "services"),
            ("", "serviceaccounts"), ("", "configmaps"), ("apps", "deployments"),
            ("apps", "replicasets"), ("apps", "statefulsets"), ("apps", "daemonsets"),
            ("apps", "controllerrevisions"), ("batch", "jobs"), ("batch", "cronjobs"),
            ("discovery.k8s.io", "endpointslices"), ("autoscaling", "horizontalpodautoscalers"),
            ("", "persistentvolumeclaims"), ("networking.k8s.io", "ingresses"))}

    @abc.abstractmethod
    def reconcile(self) -> None:
        """Reconcile everything until nothing changes (a container's process calls it on exit)."""

    def console(self, namespace: str, pod: str, container: str) -> ContainerConsole | None:
        return self.consoles.get((namespace, pod, container))

    def filesystem(self, namespace: str, pod: str, container: str) -> FileSystem | None:
        """The container's filesystem while it runs (shared by exec, its main process, listeners)."""
        return self.filesystems.get((namespace, pod, container))

    def previous_console(self, namespace: str, pod: str, container: str) -> ContainerConsole | None:
        """The console of the container's run before this one (`kubectl logs --previous`)."""
        return self.previous_consoles.get((namespace, pod, container))

    def wake_by(self, deadline: float) -> None:
        """Ask for a pass at trio time `deadline` at the latest (time-based pod work)."""
        self.wake_at = min(self.wake_at, deadline)

    def objects(self, plural: str, namespace: str) -> Iterator[dict[str, Any]]:
        kind = self.kinds[plural]
        # Live objects: read them, copy before changing.
        yield from list(self.store.iter_objects(kind.group, plural, namespace))

    def settled(self, uid: str, fingerprint: tuple[Any, ...]) -> bool:
        """Whether the reconciler of object `uid` already settled it with these inputs (the
        resourceVersions it reads): then it has nothing to do, and a pass need not redo it."""
        return self._settled.get(uid) == fingerprint

    def settle(self, uid: str, fingerprint: tuple[Any, ...] | None) -> None:
        """Record the inputs object `uid` was settled with (None: not settled, e.g. it waits
        for time to pass)."""
        if fingerprint is None:
            self._settled.pop(uid, None)
            return
        if len(self._settled) > 100_000:
            self._settled.clear()
        self._settled[uid] = fingerprint

    def owned(self, plural: str, namespace: str, uid: str) -> list[dict[str, Any]]:
        """The live objects of `plural` in `namespace` whose controller is `uid` (read, copy before
        changing), from an index rebuilt only when the resource changed: a controller asking
        for each owner's children is then linear in the objects, not in owners × objects."""
        kind = self.kinds[plural]
        version = self.store.changes(kind.group, plural)
        cached = self._owner_index.get(plural)
        if cached is None or cached[0] != version:
            index: dict[tuple[str, str], list[dict[str, Any]]] = {}
            for obj in self.store.iter_objects(kind.group, plural):
                meta = obj["metadata"]
                for ref in meta.get("ownerReferences") or []:
                    if ref.get("controller"):
                        index.setdefault((meta.get("namespace", ""), ref.get("uid", "")), []).append(obj)
                        break
            cached = self._owner_index[plural] = (version, index)
        return list(cached[1].get((namespace, uid), ()))

    def labelled(self, plural: str, namespace: str, key: str, value: str) -> list[dict[str, Any]]:
        """The live objects of `plural` in `namespace` with label `key=value` (an index rebuilt
        only when the resource changed)."""
        kind = self.kinds[plural]
        version = self.store.changes(kind.group, plural)
        cached = self._label_index.get(plural)
        if cached is None or cached[0] != version:
            index: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
            for obj in self.store.iter_objects(kind.group, plural):
                meta = obj["metadata"]
                for label, text in (meta.get("labels") or {}).items():
                    index.setdefault((meta.get("namespace", ""), label, text), []).append(obj)
            cached = self._label_index[plural] = (version, index)
        return list(cached[1].get((namespace, key, value), ()))

    def set_status(self, plural: str, obj: dict[str, Any], status: dict[str, Any]) -> None:
        if obj.get("status") == status:
            return
        obj = copy.deepcopy(obj)
        obj["status"] = status
        obj["metadata"].pop("resourceVersion", None)
        meta = obj["metadata"]
        self.store.update(self.kinds[plural], meta.get("namespace"), meta["name"], obj, subresource="status")

    def update(self, plural: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        meta.pop("resourceVersion", None)
        self.store.update(self.kinds[plural], meta.get("namespace"), meta["name"], obj)

    def event(self, involved_kind: Kind, obj: dict[str, Any], reason: str, message: str, *,
              component: str, type_: str = "Normal", field_path: str = "") -> None:
        meta = obj["metadata"]
        stamp = rfc3339(now())
        involved = {"kind": involved_kind.kind, "namespace": meta.get("namespace", "default"),
                    "name": meta["name"], "uid": meta.get("uid", ""),
                    "apiVersion": involved_kind.api_version,
                    "resourceVersion": meta.get("resourceVersion", "")}
        if field_path:
            involved["fieldPath"] = field_path
        source: dict[str, Any] = {"component": component}
        if component == "kubelet":
            source["host"] = NODE_NAME
        namespace = meta.get("namespace", "default")
        # client-go's EventCorrelator: an event identical to one already recorded (same source,
        # object, field, type, reason and message) raises that one's count and lastTimestamp
        # rather than making another (`kubectl get events` shows `x5 over 2m`).
        key = (namespace, involved["kind"], involved["name"], involved["uid"], field_path, type_, reason,
               message, component)
        seen = self._event_keys.get(key)
        previous = None if seen is None else self.store.peek(self.kinds["events"], namespace, seen)
        if seen is not None and previous is not None:
            repeated = copy.deepcopy(previous)
            repeated["count"] = int(previous.get("count") or 1) + 1
            repeated["lastTimestamp"] = stamp
            repeated["metadata"].pop("resourceVersion", None)
            try:
                self.store.update(self.kinds["events"], namespace, seen, repeated)
            except ApiError:
                pass
            return
        event: dict[str, Any] = {
            "metadata": {"name": f"{meta['name']}.{next(_EVENT_IDS):x}",
                         "namespace": meta.get("namespace", "default")},
            "involvedObject": involved, "reason": reason, "message": message, "source": source,
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1, "type": type_,
            "eventTime": None, "reportingComponent": component,
            "reportingInstance": NODE_NAME if component == "kubelet" else "",
        }
        try:
            self.store.create(self.kinds["events"], namespace, event)
        except ApiError:
            return
        if len(self._event_keys) > 100_000:
            self._event_keys.clear()
        self._event_keys[key] = event["metadata"]["name"]
