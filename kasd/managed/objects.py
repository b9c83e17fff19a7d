"""Whose objects are whose, and what to write: the pure half of managed namespaces. Functions over
Kubernetes objects (as the API answered them) and the plan; no I/O, no clock. ``provisioner`` asks
them what each answer means.

Who uses an object kasd made is recorded on it: its ``USED_BY`` annotation lists every user
(``user_of``: ``<agent>:<project>:<environment slug>``, ``-`` for a job without environment). kasd's
mark and labels say whom it made an object for; they are trusted only on an object whose UID kasd
recorded making (the caller says so: ``made``), since whoever may update an object may write them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

import attrs

from kasd.authz.templates import (
    MANAGED_BY,
    MANAGED_KINDS,
    USED_BY,
    ManagedResources,
    agent_label,
    env_label,
    project_label,
)
from kasd.seams import ProvisionError

#: users one object's record may list: bounds what is read and written per request (the
#: annotation stays far below Kubernetes' 256 KiB for all of an object's annotations)
MAX_USERS = 1000

RBAC = "rbac.authorization.k8s.io/v1"


@attrs.frozen(kw_only=True)
class Resource:
    """Where one manifest object lives in the API (from its apiVersion, kind and names)."""

    api_version: str
    kind: str
    plural: str
    name: str
    namespace: str | None

    @property
    def collection(self) -> str:
        prefix = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespace is not None:
            return f"{prefix}/namespaces/{quote(self.namespace, safe='')}/{self.plural}"
        return f"{prefix}/{self.plural}"

    @property
    def path(self) -> str:
        return f"{self.collection}/{quote(self.name, safe='')}"

    def describe(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.name}"


def resource_of(obj: Mapping[str, Any]) -> Resource:
    served = MANAGED_KINDS[str(obj["kind"])]
    meta = obj.get("metadata") or {}
    return Resource(api_version=str(obj["apiVersion"]), kind=str(obj["kind"]), plural=served.plural,
                    name=str(meta["name"]),
                    namespace=str(meta.get("namespace") or "default") if served.namespaced else None)


def namespace_resource(name: str) -> Resource:
    return Resource(api_version="v1", kind="Namespace", plural="namespaces", name=name, namespace=None)


def binding_resource(namespace: str, name: str) -> Resource:
    return Resource(api_version=RBAC, kind="RoleBinding", plural="rolebindings", name=name, namespace=namespace)


def _labels(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return (obj.get("metadata") or {}).get("labels") or {}


def plan_env_label(plan: ManagedResources) -> str | None:
    """The label of ``plan``'s environment; None for a plan without one."""
    return env_label(plan.slug, plan.project_id, plan.agent_id) if plan.slug else None


def marked(obj: Mapping[str, Any]) -> bool:
    """It carries kasd's mark (made by kasd, for whichever project and agent)."""
    return bool(_labels(obj).get(MANAGED_BY[0]) == MANAGED_BY[1])


def project_ours(obj: Mapping[str, Any], plan: ManagedResources) -> bool:
    """kasd made it for this plan's project through this plan's agent (any environment of it)."""
    labels = _labels(obj)
    return (labels.get(MANAGED_BY[0]) == MANAGED_BY[1] and project_label(plan.project_id) in labels
            and agent_label(plan.agent_id) in labels)


def ours(obj: Mapping[str, Any], plan: ManagedResources) -> bool:
    """kasd made it for this plan's environment (without one: for this project and agent). A
    namespace is shared: whether it may go is its record's to say (``leaving``)."""
    if not project_ours(obj, plan):
        return False
    env = plan_env_label(plan)
    return env is None or env in _labels(obj)


def user_of(plan: ManagedResources) -> str:
    """How ``plan``'s environment is named in an object's ``USED_BY`` record."""
    return f"{plan.agent_id}:{plan.project_id}:{plan.slug or '-'}"


def users_of(obj: Mapping[str, Any]) -> list[str] | None:
    """The object's record of its users; None when it has none that can be read (made by a kasd
    before it kept one, or edited into something else): then nobody can prove who uses it."""
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(USED_BY)
    if not isinstance(raw, str):
        return None
    try:
        users = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(users, list) or not all(isinstance(u, str) for u in users):
        return None
    return users


def recording(obj: Mapping[str, Any], users: Sequence[str]) -> dict[str, Any]:
    """``obj`` with its record saying ``users`` (the rest as it was, ``resourceVersion`` too)."""
    meta = dict(obj.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}), USED_BY: json.dumps(list(users), separators=(",", ":"))}
    return {**obj, "metadata": meta}


def delete_options(*, uid: object, resource_version: object = None) -> dict[str, Any]:
    """DeleteOptions that delete only the object read (its UID) as it was read (its resourceVersion)."""
    preconditions = {**({"uid": uid} if uid else {}), **({"resourceVersion": resource_version} if resource_version else {})}
    return {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background",
            **({"preconditions": preconditions} if preconditions else {})}


# ------------------------------------------------------------------ applying a plan


def plan_resources(plan: ManagedResources) -> list[tuple[Resource, Mapping[str, Any]]]:
    """The plan's objects in the order they are checked and created (the namespace first, as
    written), each with where it lives."""
    return [(resource_of(obj), obj) for obj in plan.objects]


def dry_run_refusal(plan: ManagedResources, resource: Resource, status: int, message: str,
                    created_here: frozenset[str] | set[str]) -> ProvisionError | None:
    """What the server-side dry run of one object answering ``status`` means: None if it may be
    created (made, or there already: 409; a namespaced object whose namespace the plan itself
    creates is checked when created), else the job's error."""
    if status in (200, 201, 409):
        return None
    if status == 404 and resource.namespace in created_here:
        return None
    return ProvisionError(status if status in (400, 403, 422) else 502,
                          f"cannot create {resource.describe()} for this job's environment "
                          f"(agent {plan.agent_id}, dry run): {message}")


def create_refusal(plan: ManagedResources, resource: Resource, status: int, message: str) -> ProvisionError:
    """The job's error for a create answered ``status`` (other than made or there already)."""
    return ProvisionError(status if status in (400, 403, 422) else 502,
                          f"cannot create {resource.describe()} for this job's environment "
                          f"(agent {plan.agent_id}): {message}")


def checks_role_first(resource: Resource, obj: Mapping[str, Any]) -> bool:
    """A RoleBinding to a ClusterRole: its role is looked for before anything is created."""
    return resource.kind == "RoleBinding" and (obj.get("roleRef") or {}).get("kind") == "ClusterRole"


def checks_role_when_made(resource: Resource, obj: Mapping[str, Any]) -> bool:
    """A RoleBinding to a Role: the Role lives in the namespace, which the plan may just have made."""
    return resource.kind == "RoleBinding" and (obj.get("roleRef") or {}).get("kind") == "Role"


@attrs.frozen
class RoleLookup:
    """Where the role a RoleBinding grants is read, and how the job is told of it."""

    path: str
    what: str
    kind: str
    name: str


def role_lookup(resource: Resource, obj: Mapping[str, Any]) -> RoleLookup | None:
    """Where to look for the role ``obj`` (a RoleBinding) grants; None for a roleRef the dry run
    refused already."""
    ref = obj.get("roleRef") or {}
    kind, name = str(ref.get("kind") or ""), str(ref.get("name") or "")
    if kind == "ClusterRole":
        return RoleLookup(f"/apis/{RBAC}/clusterroles/{quote(name, safe='')}", f"ClusterRole {name!r}", kind, name)
    if kind == "Role" and resource.namespace is not None:
        return RoleLookup(f"/apis/{RBAC}/namespaces/{quote(resource.namespace, safe='')}/roles/{quote(name, safe='')}",
                          f"Role {name!r} in namespace {resource.namespace}", kind, name)
    return None


def role_refusal(plan: ManagedResources, resource: Resource, role: RoleLookup, status: int,
                 message: str) -> ProvisionError:
    """The job's error when the role a binding grants was read with ``status`` (not 200)."""
    if status == 404:
        return ProvisionError(422, f"cannot create {resource.describe()} for this job's environment "
                                   f"(agent {plan.agent_id}): it grants {role.what}, which the cluster does not have")
    return ProvisionError(status if status == 403 else 502,
                          f"cannot check that {role.what}, which {resource.describe()} grants, exists "
                          f"(agent {plan.agent_id}): {message}")


def owned_namespace(namespace: Mapping[str, Any], plan: ManagedResources, *, made: bool) -> bool:
    """Whether kasd made ``namespace`` for this plan's project and agent (``made``: its UID is
    recorded): only then is anything of the plan placed in it."""
    return made and project_ours(namespace, plan)


@attrs.frozen
class Joining:
    """How a plan's environment joins an object that exists already (its create was a 409)."""

    #: kasd made it for this plan's project and agent (for a namespace: only then is anything
    #: placed inside)
    ours: bool
    #: the object with this environment added to its record, to be written (None: nothing to write)
    record: dict[str, Any] | None = None


def joining(current: Mapping[str, Any], plan: ManagedResources, resource: Resource, *, made: bool) -> Joining:
    """What to do with ``current`` (``resource`` as read) for ``plan``: use it as it is, or record
    this environment on it (if kasd made it — ``made``: its UID is recorded —: a namespace for
    whichever project, any other object for this plan's project and agent). ``ProvisionError``
    for one being deleted or whose record is full."""
    if not marked(current) or not made:
        return Joining(ours=False)  # not kasd's: used as it is, and nothing of kasd's goes in or on it
    project = project_ours(current, plan)
    if resource.kind != "Namespace" and not project:
        return Joining(ours=False)  # kasd's for another project or agent: used as it is, never recorded on
    if (current.get("metadata") or {}).get("deletionTimestamp"):
        raise ProvisionError(409, f"{resource.describe()} is being deleted (the last environment that "
                                  "used it stopped); try again once it is gone")
    users = users_of(current)
    me = user_of(plan)
    if users is None or me in users:
        # (without a record: made before kasd recorded users; never deleted, so recording is moot)
        return Joining(ours=project)
    if len(users) >= MAX_USERS:
        raise ProvisionError(409, f"{resource.describe()} is already used by {len(users)} environments, "
                                  f"the most kasd records; stop some of them")
    return Joining(ours=project, record=recording(current, [*users, me]))


# ------------------------------------------------------------------ stopping


def unnamed_binding_namespaces(plan: ManagedResources) -> list[str]:
    """The namespaces where a stop looks for this environment's RoleBindings the plan no longer
    names (none for a plan without environment)."""
    if plan_env_label(plan) is None:
        return []
    resources = [resource_of(obj) for obj in plan.objects]
    found = dict.fromkeys(r.name if r.kind == "Namespace" else r.namespace for r in resources)
    return [namespace for namespace in found if namespace is not None]


def binding_list_path(plan: ManagedResources, namespace: str) -> str:
    """The list of kasd's RoleBindings for this plan's environment in ``namespace``."""
    selector = quote(f"{MANAGED_BY[0]}={MANAGED_BY[1]},{plan_env_label(plan)}", safe="")
    return f"/apis/{RBAC}/namespaces/{quote(namespace, safe='')}/rolebindings?labelSelector={selector}"


def unnamed_bindings(plan: ManagedResources, namespace: str, items: object) -> list[Resource]:
    """Of the RoleBindings listed in ``namespace``, those of this plan's environment that kasd made
    (by their labels) and the plan no longer names (a ``roles:`` or template edited since)."""
    named = {(r.namespace, r.name) for r in (resource_of(obj) for obj in plan.objects) if r.kind == "RoleBinding"}
    found: list[Resource] = []
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, dict):
            continue
        name = (item.get("metadata") or {}).get("name")
        if not isinstance(name, str) or (namespace, name) in named or not ours(item, plan):
            continue
        found.append(binding_resource(namespace, name))
    return found


@attrs.frozen
class Leaving:
    """What a stop does to one object as read: keep it untouched (``kept``, why), write its record
    without this environment (``record``: others still use it), or delete it (``delete``: the
    DeleteOptions, this environment its last user)."""

    kept: str | None = None
    record: dict[str, Any] | None = None
    delete: dict[str, Any] | None = None


def leaving(current: Mapping[str, Any], plan: ManagedResources, resource: Resource, *, made: bool) -> Leaving:
    """Remove this plan's user from ``current``'s record; delete it if that user was its only one.
    An object other than a namespace without a record (made by a kasd before objects kept one)
    goes as it did then: if it carries this environment's label. A namespace without one never
    goes. ``made``: its UID is recorded as made by kasd."""
    if not marked(current) or not made:
        return Leaving(kept="not-made-by-kasd")
    namespace = resource.kind == "Namespace"
    if not namespace and not project_ours(current, plan):
        return Leaving(kept="not-made-by-kasd")
    me = user_of(plan)
    users = users_of(current)
    if users is None and not namespace and ours(current, plan):
        users = [me]  # made before objects kept a record: this environment's by its label
    if users is None:
        return Leaving(kept="users-not-recorded" if namespace else "not-made-by-kasd")
    others = [u for u in users if u != me]
    if others == users:  # not a user of it (never applied here): nothing to remove
        return Leaving(kept="used-by-another-environment")
    if others:
        return Leaving(record=recording(current, others))
    # Only this user: deleted unless the record changed since it was read (a user that recorded
    # itself meanwhile, on any replica, makes this a 409 and is seen next round).
    meta = current.get("metadata") or {}
    return Leaving(delete=delete_options(uid=meta.get("uid"), resource_version=meta.get("resourceVersion")))


__all__ = [
    "MAX_USERS",
    "Joining",
    "Leaving",
    "Resource",
    "RoleLookup",
    "binding_list_path",
    "binding_resource",
    "checks_role_first",
    "checks_role_when_made",
    "create_refusal",
    "delete_options",
    "dry_run_refusal",
    "joining",
    "leaving",
    "marked",
    "namespace_resource",
    "ours",
    "owned_namespace",
    "plan_env_label",
    "plan_resources",
    "project_ours",
    "recording",
    "resource_of",
    "role_lookup",
    "role_refusal",
    "unnamed_binding_namespaces",
    "unnamed_bindings",
    "user_of",
    "users_of",
]
