"""The dependency graph of an environment's objects, and its JSON (docs/environments.md).

Edges, each only between two objects of the set (a reference to something not fetched draws
nothing):

``owns``     owner → dependent by ``metadata.ownerReferences`` (matched by uid; by name only for a
             reference without uid), the ``controller: true`` reference first, else the first that
             resolves; and EndpointSlice ← Service by its ``kubernetes.io/service-name`` label when the
             slice has no owner in the set. A dependent has at most one ``owns`` parent; the owner
             must be in the dependent's namespace or cluster-scoped (the API's own rule). In bad data
             an ownership cycle is broken at its smallest node id (it becomes a root), so the
             ``owns`` edges are a forest and the result does not depend on the input order.
``selects``  Service → Pod when the Service's ``spec.selector`` is non-empty and ⊆ the pod's labels
             (same namespace).
``routes``   Ingress → Service (default backend and every rule's backends, same namespace).
``scales``   HPA → its ``scaleTargetRef`` (same namespace; any group when the ref has no apiVersion).
``uses``     Pod → ConfigMap / Secret / PersistentVolumeClaim / ServiceAccount (references.pod_uses).
``binds``    PersistentVolumeClaim → PersistentVolume (``spec.volumeName``).

The environment's health (``Graph.health``) is the roll-up of the **roots** — the objects nothing in
the set owns — as Argo CD rolls up an application over the resources it manages and not over what
their controllers made: a Deployment's health already speaks for its ReplicaSets and Pods (a
crash-looping pod keeps it Progressing, and Degraded once its progress deadline passes), a CronJob's
for its Jobs. So a failed pod that a Job retried past, or a failed Job a CronJob keeps in its history,
does not hold the environment Degraded; every node still has its own health for the tree and graph.
A bare Pod, or a Pod whose owner was not fetched, is a root and counts.

Objects without apiVersion, kind or name, or with a ``/`` in kind, namespace or name (no API server
serves such a name), are left out. Two objects with one id (the same object listed twice, say at
two versions) are one node: the one with the larger ``resourceVersion`` (then uid, then body) wins.

Cost, for N objects, R references read (owner refs, volumes, env, backends…) and E edges drawn:
O(N log N + R + E) and O(N + E) memory. Owner refs resolve through a uid → id dict, one lookup each
(a child with 10,000 owner refs is 10,000 lookups); a Service's selector is matched against the
pods of its namespace through a (key, value) → pods index, starting from the rarest pair of the
selector, so a Service that selects 10,000 pods costs those 10,000 checks, and one that selects
none costs the size of its rarest pair's posting list.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from kasd.envgraph.health import Health, health_of
from kasd.envgraph.identity import identity, mapping, seq, text
from kasd.envgraph.references import (
    SERVICE_NAME_LABEL,
    ingress_services,
    pod_uses,
    scale_target,
    service_selector,
)
from kasd.envgraph.rollup import rollup

__all__ = ["GITLAB_LABELS", "RELATIONS", "Edge", "Graph", "Node", "build_graph", "tree_lines"]

GITLAB_LABELS = ("app.gitlab.com/project_id", "app.gitlab.com/environment_slug")
RELATIONS = ("owns", "selects", "routes", "scales", "uses", "binds")


@attrs.frozen
class Node:
    id: str
    group: str
    version: str
    kind: str
    namespace: str
    name: str
    uid: str
    health: Health
    labelled: bool  # carries the environment's labels (found by them, not as a dependent)
    created: str | None  # metadata.creationTimestamp as the API wrote it

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "group": self.group, "version": self.version, "kind": self.kind,
                "namespace": self.namespace, "name": self.name, "uid": self.uid,
                "labelled": self.labelled, "created": self.created, "health": self.health.to_json()}


@attrs.frozen(order=True)
class Edge:
    source: str
    target: str
    relation: str

    def to_json(self) -> dict[str, str]:
        return {"source": self.source, "target": self.target, "relation": self.relation}


@attrs.frozen(kw_only=True)
class Graph:
    nodes: dict[str, Node]
    edges: tuple[Edge, ...]  # sorted
    roots: tuple[str, ...]  # sorted: the nodes without an ``owns`` parent
    health: Health  # the roll-up of the roots' health (see the module docstring)

    def children(self) -> dict[str, list[str]]:
        """Each owner's ``owns`` children, sorted by id."""
        children: dict[str, list[str]] = defaultdict(list)
        for edge in self.edges:  # sorted, so each list is too
            if edge.relation == "owns":
                children[edge.source].append(edge.target)
        return dict(children)

    def to_json(self) -> dict[str, Any]:
        """The shape every consumer reads (REST API, SSE, dashboard, kasctl); deterministic."""
        return {"health": self.health.to_json(),
                "nodes": [self.nodes[i].to_json() for i in sorted(self.nodes)],
                "edges": [e.to_json() for e in self.edges],
                "roots": list(self.roots)}


def tree_lines(graph: Graph) -> list[tuple[int, str]]:
    """The ``owns`` forest depth first: (depth, node id), roots at depth 0, siblings by id."""
    children = graph.children()
    lines: list[tuple[int, str]] = []
    stack = [(0, root) for root in reversed(graph.roots)]
    while stack:  # no recursion: an ownership chain can be as deep as the set is large
        depth, node = stack.pop()
        lines.append((depth, node))
        stack.extend((depth + 1, child) for child in reversed(children.get(node, ())))
    return lines


def _rv(obj: Mapping[str, Any]) -> int:
    raw = text(mapping(obj.get("metadata")).get("resourceVersion"))
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) < 30 else -1


def _preferred(a: Mapping[str, Any], b: Mapping[str, Any]) -> Mapping[str, Any]:
    def key(o: Mapping[str, Any]) -> tuple[int, str, str]:
        uid = text(mapping(o.get("metadata")).get("uid"))
        return _rv(o), uid, json.dumps(o, sort_keys=True, default=str)
    return a if key(a) >= key(b) else b


def _labelled(labels: Mapping[str, Any], selector: Mapping[str, str] | None) -> bool:
    if selector is None:
        return all(isinstance(labels.get(k), str) for k in GITLAB_LABELS)
    return all(labels.get(k) == v for k, v in selector.items())


def _break_cycles(parent: dict[str, str]) -> None:
    """Each node has at most one parent, so each component holds at most one cycle; cut every cycle
    at its smallest id. Linear; independent of the order the nodes came in."""
    state: dict[str, int] = {}  # 1: on the walk being made, 2: done
    for start in sorted(parent):
        if start in state:
            continue
        path = []
        node: str | None = start
        while node is not None and node not in state:
            state[node] = 1
            path.append(node)
            node = parent.get(node)
        if node is not None and state[node] == 1:
            cycle = path[path.index(node):]
            del parent[min(cycle)]
        for visited in path:
            state[visited] = 2


def build_graph(objects: Iterable[Mapping[str, Any]], *,
                selector: Mapping[str, str] | None = None) -> Graph:
    """The graph of ``objects`` (whole objects as the API answered). ``selector``: the environment's
    labels, which mark a node ``labelled``; without it, an object carrying both of GitLab's label
    keys is."""
    chosen: dict[str, Mapping[str, Any]] = {}
    for obj in objects:
        if not isinstance(obj, Mapping):
            continue
        group, version, kind, namespace, name = identity(obj)
        if not version or not kind or not name or "/" in kind + namespace + name:
            continue
        node_id = f"{group}/{kind}/{namespace}/{name}"
        chosen[node_id] = _preferred(chosen[node_id], obj) if node_id in chosen else obj

    nodes: dict[str, Node] = {}
    by_uid: dict[str, str] = {}
    by_name: dict[tuple[str, str, str], list[str]] = defaultdict(list)  # (ns, Kind, name) → ids
    pods_by_label: dict[str, dict[tuple[str, str], list[str]]] = defaultdict(lambda: defaultdict(list))
    pod_labels: dict[str, Mapping[str, Any]] = {}
    for node_id in sorted(chosen):
        obj = chosen[node_id]
        group, version, kind, namespace, name = identity(obj)
        meta = mapping(obj.get("metadata"))
        labels = mapping(meta.get("labels"))
        uid = text(meta.get("uid"))
        created = meta.get("creationTimestamp")
        nodes[node_id] = Node(node_id, group, version, kind, namespace, name, uid, health_of(obj),
                              _labelled(labels, selector), created if isinstance(created, str) else None)
        if uid:
            by_uid.setdefault(uid, node_id)  # ids are sorted: a uid seen twice keeps the smaller id
        by_name[(namespace, kind, name)].append(node_id)
        if group == "" and kind == "Pod":
            pod_labels[node_id] = labels
            for pair in labels.items():
                if isinstance(pair[1], str):
                    pods_by_label[namespace][pair].append(node_id)

    def owner_of(child: str, ref: Mapping[str, Any]) -> str | None:
        node = nodes[child]
        uid = text(ref.get("uid"))
        if uid:
            owner = by_uid.get(uid)
        else:
            ref_group = text(ref.get("apiVersion")).rpartition("/")[0]
            ref_kind, ref_name = text(ref.get("kind")), text(ref.get("name"))
            owner = next((o for o in (f"{ref_group}/{ref_kind}/{node.namespace}/{ref_name}",
                                      f"{ref_group}/{ref_kind}//{ref_name}") if o in nodes), None)
        if owner is None or owner == child or nodes[owner].namespace not in ("", node.namespace):
            return None
        return owner

    parent: dict[str, str] = {}
    edges: set[Edge] = set()
    for node_id, obj in chosen.items():
        refs = [mapping(r) for r in seq(mapping(obj.get("metadata")).get("ownerReferences"))]
        for ref in [r for r in refs if r.get("controller") is True] + refs:
            if (owner := owner_of(node_id, ref)) is not None:
                parent[node_id] = owner
                break
        node = nodes[node_id]
        if node_id not in parent and node.group == "discovery.k8s.io" and node.kind == "EndpointSlice":
            service = text(mapping(mapping(obj.get("metadata")).get("labels")).get(SERVICE_NAME_LABEL))
            if (target := f"/Service/{node.namespace}/{service}") in nodes and service:
                parent[node_id] = target
    _break_cycles(parent)
    edges.update(Edge(owner, child, "owns") for child, owner in parent.items())

    def link(source: str, target: str, relation: str) -> None:
        if target in nodes and target != source:
            edges.add(Edge(source, target, relation))

    for node_id, obj in chosen.items():
        node = nodes[node_id]
        ns, spec = node.namespace, mapping(obj.get("spec"))
        if node.group == "" and node.kind == "Service":
            wanted = service_selector(obj)
            index = pods_by_label.get(ns)
            if wanted and index is not None:
                postings = [index.get(pair, []) for pair in wanted.items()]
                for pod in min(postings, key=len):
                    if all(pod_labels[pod].get(k) == v for k, v in wanted.items()):
                        link(node_id, pod, "selects")
        elif node.kind == "Ingress" and node.group in ("networking.k8s.io", "extensions"):
            for service in ingress_services(obj):
                link(node_id, f"/Service/{ns}/{service}", "routes")
        elif node.group == "autoscaling" and node.kind == "HorizontalPodAutoscaler":
            if (scaled := scale_target(obj)) is not None:
                target_group, kind, name = scaled
                for candidate in by_name.get((ns, kind, name), ()):
                    if target_group is None or nodes[candidate].group == target_group:
                        link(node_id, candidate, "scales")
        elif node.group == "" and node.kind == "Pod":
            for kind, name in pod_uses(obj):
                link(node_id, f"/{kind}/{ns}/{name}", "uses")
        elif node.group == "" and node.kind == "PersistentVolumeClaim":
            volume = text(spec.get("volumeName"))
            if volume:
                link(node_id, f"/PersistentVolume//{volume}", "binds")

    roots = tuple(sorted(i for i in nodes if i not in parent))
    ordered = tuple(sorted(edges, key=lambda e: (e.source, e.target, e.relation)))  # attrs' __lt__ is slow
    return Graph(nodes=nodes, edges=ordered, roots=roots,
                 health=rollup((i, nodes[i].health) for i in roots))
