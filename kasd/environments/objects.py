"""What the shell does to objects before anyone sees them, and which unlabelled objects belong to
an environment (pure: no I/O).

``sanitize`` drops what a dashboard must never show (a Secret's values — ``data``, ``stringData``
and kubectl's ``last-applied-configuration`` annotation, which holds them too) and what no one reads
(``managedFields``). ``member_ids`` and ``references`` decide the unlabelled dependents: this is the
minimal stand-in for ``kasd.envgraph``'s ``dependents_to_fetch`` and ``node_id`` (part A of issue 27,
written in parallel): replace the bodies of ``node_id``, ``member_ids`` and ``references`` with calls
to it once it is merged; nothing else here calls the graph.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

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


def node_id(obj: Mapping[str, Any]) -> str:
    """``"<group>/<Kind>/<namespace>/<name>"`` (the contract's node id; ``kasd.envgraph.node_id``)."""
    meta = obj.get("metadata") or {}
    return f"{group_of(obj)}/{obj.get('kind', '')}/{meta.get('namespace') or ''}/{meta.get('name', '')}"


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
    uids = {str((pending[i].get("metadata") or {}).get("uid")) for i in members}
    services = {(_meta(pending[i], "namespace"), _meta(pending[i], "name")) for i in members
                if pending[i].get("kind") == "Service" and group_of(pending[i]) == ""}
    rest = {i: o for i, o in pending.items() if i not in members}
    changed = True
    while changed and rest:
        changed = False
        for i, o in list(rest.items()):
            owners = {str(r.get("uid")) for r in (o.get("metadata") or {}).get("ownerReferences") or ()
                      if isinstance(r, dict)}
            slice_of = (o.get("kind") == "EndpointSlice" and
                        (_meta(o, "namespace"), ((o.get("metadata") or {}).get("labels") or {}).get(SERVICE_NAME_LABEL))
                        in services)
            if owners & uids or slice_of:
                members.add(i)
                uids.add(str(_meta(o, "uid")))
                del rest[i]
                changed = True
    return members


def references(objects: Iterable[Mapping[str, Any]]) -> set[tuple[str, str, str, str]]:
    """(group, plural, namespace, name) of what member objects use and may lack the labels: the
    ConfigMaps, Secrets, PersistentVolumeClaims and ServiceAccount of each Pod, the
    PersistentVolume of each bound PVC (namespace empty)."""
    out: set[tuple[str, str, str, str]] = set()
    for obj in objects:
        kind, namespace = obj.get("kind"), _meta(obj, "namespace")
        if group_of(obj) != "":
            continue
        if kind == "Pod":
            spec = obj.get("spec") or {}
            out.add(("", "serviceaccounts", namespace, str(spec.get("serviceAccountName") or "default")))
            for plural, name in _pod_uses(spec):
                out.add(("", plural, namespace, name))
        elif kind == "PersistentVolumeClaim":
            volume = (obj.get("spec") or {}).get("volumeName")
            if isinstance(volume, str) and volume:
                out.add(("", "persistentvolumes", "", volume))
    return out


def _pod_uses(spec: Mapping[str, Any]) -> Iterable[tuple[str, str]]:
    for volume in spec.get("volumes") or ():
        if not isinstance(volume, dict):
            continue
        yield from _named("configmaps", (volume.get("configMap") or {}).get("name"))
        yield from _named("secrets", (volume.get("secret") or {}).get("secretName"))
        yield from _named("persistentvolumeclaims", (volume.get("persistentVolumeClaim") or {}).get("claimName"))
        for source in (volume.get("projected") or {}).get("sources") or ():
            if isinstance(source, dict):
                yield from _named("configmaps", (source.get("configMap") or {}).get("name"))
                yield from _named("secrets", (source.get("secret") or {}).get("name"))
    for pull in spec.get("imagePullSecrets") or ():
        if isinstance(pull, dict):
            yield from _named("secrets", pull.get("name"))
    for container in [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]:
        if not isinstance(container, dict):
            continue
        for env in container.get("env") or ():
            source = (env.get("valueFrom") or {}) if isinstance(env, dict) else {}
            yield from _named("configmaps", (source.get("configMapKeyRef") or {}).get("name"))
            yield from _named("secrets", (source.get("secretKeyRef") or {}).get("name"))
        for env_from in container.get("envFrom") or ():
            if isinstance(env_from, dict):
                yield from _named("configmaps", (env_from.get("configMapRef") or {}).get("name"))
                yield from _named("secrets", (env_from.get("secretRef") or {}).get("name"))


def _named(plural: str, name: object) -> Iterable[tuple[str, str]]:
    if isinstance(name, str) and name:
        yield plural, name


def _meta(obj: Mapping[str, Any], key: str) -> str:
    return str((obj.get("metadata") or {}).get(key) or "")


__all__ = ["NO_RESOURCES", "PROJECT_LABEL", "SLUG_LABEL", "label_selector", "labelled", "member_ids",
           "no_resources_hint", "node_id", "references", "sanitize", "sanitize_answer"]
