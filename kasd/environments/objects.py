"""What the shell does to objects before anyone sees them, and which unlabelled objects belong to
an environment (pure: no I/O).

``sanitize`` drops what a dashboard must never show (a Secret's values — ``data``, ``stringData``
and kubectl's ``last-applied-configuration`` annotation, which holds them too) and what no one reads
(``managedFields``). ``member_ids`` and ``references`` decide the unlabelled dependents: which
objects discovery found belong to the environment (owner chains, a Service's EndpointSlices), and
which objects its Pods and PVCs use, read with ``kasd.envgraph``'s rules (``pod_uses``, and its
check of the names that may go into a path). ``node_id`` is ``kasd.envgraph.node_id``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kasd.envgraph import node_id
from kasd.envgraph.dependents import valid_name, valid_namespace
from kasd.envgraph.references import pod_uses

PROJECT_LABEL = "app.gitlab.com/project_id"
SLUG_LABEL = "app.gitlab.com/environment_slug"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"

#: the start of GitLab's message when no resource carries the labels (the environments UI blueprint,
#: doc/architecture/blueprints/gitlab_agent_deployments: "There are no resources found for the
#: environment. Do resources have GitLab preserved labels? See <troubleshooting-doc-link>")
NO_RESOURCES = "There are no resources found for the environment. Do resources have GitLab preserved labels?"


def label_selector(project_id: int, slug: str) -> str:
    return f"{PROJECT_LABEL}={project_id},{SLUG_LABEL}={slug}"


def no_resources_hint(project_id: int, slug: str) -> str:
    return (f"{NO_RESOURCES} Add the labels {PROJECT_LABEL}: \"{project_id}\" and {SLUG_LABEL}: \"{slug}\" "
            "to the metadata of the objects this environment's deployments make.")


def group_of(obj: Mapping[str, Any]) -> str:
    api_version = str(obj.get("apiVersion") or "")
    return api_version.rpartition("/")[0] if "/" in api_version else ""


def sanitize(obj: Mapping[str, Any], *, api_version: str | None = None, kind: str | None = None) -> dict[str, Any]:
    """A copy fit to leave the shell: ``apiVersion``/``kind`` set (a list's items lack them),
    ``managedFields`` dropped, a Secret's values dropped (its keys' names stay in no field)."""
    out = dict(obj)
    if api_version and not out.get("apiVersion"):
        out["apiVersion"] = api_version
    if kind and not out.get("kind"):
        out["kind"] = kind
    meta = dict(out.get("metadata") or {})
    meta.pop("managedFields", None)
    if out.get("kind") == "Secret" and group_of(out) == "":
        out.pop("data", None)
        out.pop("stringData", None)
        if isinstance(meta.get("annotations"), dict) and LAST_APPLIED in meta["annotations"]:
            meta["annotations"] = {k: v for k, v in meta["annotations"].items() if k != LAST_APPLIED}
    out["metadata"] = meta
    return out


def sanitize_answer(body: Mapping[str, Any]) -> dict[str, Any]:
    """An API answer (one object, a list, a watch event) with every object in it sanitized."""
    out = dict(body)
    kind = str(out.get("kind") or "")
    if kind.endswith("List") and isinstance(out.get("items"), list):
        item_kind = kind[:-4]
        out["items"] = [sanitize(i, api_version=str(out.get("apiVersion") or ""), kind=item_kind)
                        for i in out["items"] if isinstance(i, dict)]
        return sanitize(out) if kind != "List" else out
    if isinstance(out.get("object"), dict) and "type" in out:
        out["object"] = sanitize(out["object"])
        return out
    return sanitize(out)


def labelled(obj: Mapping[str, Any], project_id: int, slug: str) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return isinstance(labels, dict) and labels.get(PROJECT_LABEL) == str(project_id) and labels.get(SLUG_LABEL) == slug


def member_ids(objects: Iterable[Mapping[str, Any]], project_id: int, slug: str) -> set[str]:
    """The node ids of ``objects`` that belong to the environment: the labelled ones, and (to any
    depth) those owned by a member (``ownerReferences``: a Deployment's ReplicaSets, their Pods, a
    CronJob's Jobs) and the EndpointSlices of member Services (``kubernetes.io/service-name``)."""
    pending = {node_id(o): o for o in objects}
    members = {i for i, o in pending.items() if labelled(o, project_id, slug)}
    # one pass to index who points at what, then a walk from the labelled objects: linear in the
    # objects and their references whatever order a chain of owners comes in (the cluster's answer,
    # and the owner references in it, are the tenant's to write)
    children = adoption_index((i, o) for i, o in pending.items() if i not in members)
    todo = list(members)
    while todo:
        for child in adopted(children, pending[todo.pop()]):
            if child not in members:
                members.add(child)
                todo.append(child)
    return members


def adopter_keys(obj: Mapping[str, Any]) -> tuple[str, ...]:
    """The keys under which ``adoption_index`` files the objects ``obj`` adopts: its uid, and for a
    core Service, its namespace and name (its EndpointSlices)."""
    keys: tuple[str, ...] = (f"uid:{_meta(obj, 'uid')}",)
    if obj.get("kind") == "Service" and group_of(obj) == "":
        keys += (f"service:{_meta(obj, 'namespace')}/{_meta(obj, 'name')}",)
    return keys


def adoption_index(objects: Iterable[tuple[str, Mapping[str, Any]]]) -> dict[str, list[str]]:
    """(id, object) pairs filed under each key of an owner that would adopt them (``adopter_keys``):
    each owner reference's uid, and an EndpointSlice's Service."""
    index: dict[str, list[str]] = {}
    for ident, obj in objects:
        meta = obj.get("metadata") or {}
        refs = meta.get("ownerReferences") if isinstance(meta, dict) else None
        for ref in refs if isinstance(refs, list) else ():
            if isinstance(ref, dict):
                index.setdefault(f"uid:{ref.get('uid')}", []).append(ident)
        labels = meta.get("labels") if isinstance(meta, dict) else None
        if obj.get("kind") == "EndpointSlice" and isinstance(labels, dict) and SERVICE_NAME_LABEL in labels:
            index.setdefault(f"service:{_meta(obj, 'namespace')}/{labels[SERVICE_NAME_LABEL]}", []).append(ident)
    return index


def adopted(index: Mapping[str, list[str]], obj: Mapping[str, Any]) -> list[str]:
    """The ids ``index`` (``adoption_index``) files under ``obj``'s keys: what it adopts."""
    return [i for key in adopter_keys(obj) for i in index.get(key, ())]


def references(objects: Iterable[Mapping[str, Any]]) -> set[tuple[str, str, str, str]]:
    """(group, plural, namespace, name) of what member objects use and may lack the labels: the
    ConfigMaps, Secrets, PersistentVolumeClaims and ServiceAccount of each Pod
    (``kasd.envgraph.pod_uses``), the PersistentVolume of each bound PVC (namespace empty). A name
    or namespace the API server would refuse (``..``, ``?``, ``a/b``: taken from the cluster's
    answer, it would change the path it is put in) is left out, as ``kasd.envgraph`` leaves it."""
    out: set[tuple[str, str, str, str]] = set()
    for obj in objects:
        kind, namespace = obj.get("kind"), _meta(obj, "namespace")
        if group_of(obj) != "":
            continue
        if kind == "Pod" and valid_namespace(namespace):
            for used_kind, name in pod_uses(obj):
                if used_kind in _PLURALS and valid_name(name):
                    out.add(("", _PLURALS[used_kind], namespace, name))
        elif kind == "PersistentVolumeClaim":
            volume = (obj.get("spec") or {}).get("volumeName")
            if isinstance(volume, str) and valid_name(volume):
                out.add(("", "persistentvolumes", "", volume))
    return out


_PLURALS = {"ConfigMap": "configmaps", "Secret": "secrets", "PersistentVolumeClaim": "persistentvolumeclaims",
            "ServiceAccount": "serviceaccounts"}


def _meta(obj: Mapping[str, Any], key: str) -> str:
    return str((obj.get("metadata") or {}).get(key) or "")


__all__ = ["NO_RESOURCES", "PROJECT_LABEL", "SLUG_LABEL", "label_selector", "labelled", "member_ids",
           "no_resources_hint", "node_id", "references", "sanitize", "sanitize_answer"]
