"""The kinds kubesim serves: one table drives discovery, OpenAPI, routing, storage and tables.

`Kind` is the static description of a resource; `Registry` is the live set, which grows and
shrinks as CustomResourceDefinitions come and go.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@attrs.frozen(kw_only=True)
class PrinterColumn:
    """An `additionalPrinterColumns` entry of a CustomResourceDefinition."""

    name: str
    type: str
    json_path: str
    description: str = ""
    priority: int = 0
    format: str = ""


@attrs.frozen(kw_only=True, eq=False)
class Kind:
    group: str  # "" is the core group
    version: str
    kind: str
    plural: str
    singular: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ALL_VERBS
    subresources: tuple[str, ...] = ()
    has_generation: bool = False
    # OpenAPI definition name, e.g. io.k8s.api.apps.v1.Deployment ("" for custom resources).
    definition: str = ""
    # Requests answered at once and never stored (access reviews, whoami).
    virtual: bool = False
    # Set for kinds a CustomResourceDefinition defines.
    custom: bool = False
    schema: dict[str, Any] | None = None
    printer_columns: tuple[PrinterColumn, ...] = ()
    crd_name: str = ""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def group_resource(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    def base_path(self, namespace: str | None) -> str:
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            return f"{prefix}/namespaces/{namespace}/{self.plural}"
        return f"{prefix}/{self.plural}"


def _k(**kw: Any) -> Kind:
    return Kind(**kw)


BUILTIN_KINDS: tuple[Kind, ...] = (
    _k(group="", version="v1", kind="Namespace", plural="namespaces", singular="namespace",
       namespaced=False, short_names=("ns",), subresources=("status", "finalize"),
       verbs=("create", "delete", "get", "list", "patch", "update", "watch"),
       definition="io.k8s.api.core.v1.Namespace"),
    _k(group="", version="v1", kind="Node", plural="nodes", singular="node",
       namespaced=False, short_names=("no",), subresources=("status",),
       definition="io.k8s.api.core.v1.Node"),
    _k(group="", version="v1", kind="Pod", plural="pods", singular="pod", namespaced=True,
       short_names=("po",), categories=("all",),
       subresources=("status", "log", "exec", "attach", "portforward", "binding", "eviction"),
       definition="io.k8s.api.core.v1.Pod"),
    _k(group="", version="v1", kind="Service", plural="services", singular="service",
       namespaced=True, short_names=("svc",), categories=("all",), subresources=("status",),
       verbs=("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"),
       definition="io.k8s.api.core.v1.Service"),
    _k(group="", version="v1", kind="ConfigMap", plural="configmaps", singular="configmap",
       namespaced=True, short_names=("cm",), definition="io.k8s.api.core.v1.ConfigMap"),
    _k(group="", version="v1", kind="Secret", plural="secrets", singular="secret",
       namespaced=True, definition="io.k8s.api.core.v1.Secret"),
    _k(group="", version="v1", kind="Event", plural="events", singular="event", namespaced=True,
       short_names=("ev",), definition="io.k8s.api.core.v1.Event"),
    _k(group="", version="v1", kind="PersistentVolumeClaim", plural="persistentvolumeclaims",
       singular="persistentvolumeclaim", namespaced=True, short_names=("pvc",),
       subresources=("status",), definition="io.k8s.api.core.v1.PersistentVolumeClaim"),
    _k(group="", version="v1", kind="ServiceAccount", plural="serviceaccounts",
       singular="serviceaccount", namespaced=True, short_names=("sa",),
       subresources=("token",), definition="io.k8s.api.core.v1.ServiceAccount"),
    _k(group="apps", version="v1", kind="Deployment", plural="deployments",
       singular="deployment", namespaced=True, short_names=("deploy",), categories=("all",),
       subresources=("status", "scale"), has_generation=True,
       definition="io.k8s.api.apps.v1.Deployment"),
    _k(group="apps", version="v1", kind="ReplicaSet", plural="replicasets",
       singular="replicaset", namespaced=True, short_names=("rs",), categories=("all",),
       subresources=("status", "scale"), has_generation=True,
       definition="io.k8s.api.apps.v1.ReplicaSet"),
    _k(group="apps", version="v1", kind="StatefulSet", plural="statefulsets",
       singular="statefulset", namespaced=True, short_names=("sts",), categories=("all",),
       subresources=("status", "scale"), has_generation=True,
       definition="io.k8s.api.apps.v1.StatefulSet"),
    _k(group="apps", version="v1", kind="DaemonSet", plural="daemonsets", singular="daemonset",
       namespaced=True, short_names=("ds",), categories=("all",), subresources=("status",),
       has_generation=True, definition="io.k8s.api.apps.v1.DaemonSet"),
    _k(group="apps", version="v1", kind="ControllerRevision", plural="controllerrevisions",
       singular="controllerrevision", namespaced=True,
       definition="io.k8s.api.apps.v1.ControllerRevision"),
    _k(group="batch", version="v1", kind="Job", plural="jobs", singular="job", namespaced=True,
       categories=("all",), subresources=("status",), has_generation=True,
       definition="io.k8s.api.batch.v1.Job"),
    _k(group="batch", version="v1", kind="CronJob", plural="cronjobs", singular="cronjob",
       namespaced=True, short_names=("cj",), categories=("all",), subresources=("status",),
       has_generation=True, definition="io.k8s.api.batch.v1.CronJob"),
    _k(group="discovery.k8s.io", version="v1", kind="EndpointSlice", plural="endpointslices",
       singular="endpointslice", namespaced=True,
       definition="io.k8s.api.discovery.v1.EndpointSlice"),
    _k(group="networking.k8s.io", version="v1", kind="Ingress", plural="ingresses",
       singular="ingress", namespaced=True, short_names=("ing",), subresources=("status",),
       has_generation=True, definition="io.k8s.api.networking.v1.Ingress"),
    _k(group="networking.k8s.io", version="v1", kind="NetworkPolicy", plural="networkpolicies",
       singular="networkpolicy", namespaced=True, short_names=("netpol",), has_generation=True,
       definition="io.k8s.api.networking.v1.NetworkPolicy"),
    _k(group="policy", version="v1", kind="PodDisruptionBudget", plural="poddisruptionbudgets",
       singular="poddisruptionbudget", namespaced=True, short_names=("pdb",),
       subresources=("status",), has_generation=True,
       definition="io.k8s.api.policy.v1.PodDisruptionBudget"),
    _k(group="autoscaling", version="v2", kind="HorizontalPodAutoscaler",
       plural="horizontalpodautoscalers", singular="horizontalpodautoscaler", namespaced=True,
       short_names=("hpa",), categories=("all",), subresources=("status",),
       definition="io.k8s.api.autoscaling.v2.HorizontalPodAutoscaler"),
    _k(group="autoscaling", version="v1", kind="HorizontalPodAutoscaler",
       plural="horizontalpodautoscalers", singular="horizontalpodautoscaler", namespaced=True,
       short_names=("hpa",), categories=("all",), subresources=("status",),
       definition="io.k8s.api.autoscaling.v1.HorizontalPodAutoscaler"),
    _k(group="authorization.k8s.io", version="v1", kind="SelfSubjectAccessReview",
       plural="selfsubjectaccessreviews", singular="selfsubjectaccessreview", namespaced=False,
       verbs=("create",), virtual=True),
    _k(group="authorization.k8s.io", version="v1", kind="SelfSubjectRulesReview",
       plural="selfsubjectrulesreviews", singular="selfsubjectrulesreview", namespaced=False,
       verbs=("create",), virtual=True),
    _k(group="authentication.k8s.io", version="v1", kind="SelfSubjectReview",
       plural="selfsubjectreviews", singular="selfsubjectreview", namespaced=False,
       verbs=("create",), virtual=True),
    _k(group="rbac.authorization.k8s.io", version="v1", kind="Role", plural="roles",
       singular="role", namespaced=True, definition="io.k8s.api.rbac.v1.Role"),
    _k(group="rbac.authorization.k8s.io", version="v1", kind="RoleBinding", plural="rolebindings",
       singular="rolebinding", namespaced=True, definition="io.k8s.api.rbac.v1.RoleBinding"),
    _k(group="rbac.authorization.k8s.io", version="v1", kind="ClusterRole", plural="clusterroles",
       singular="clusterrole", namespaced=False, definition="io.k8s.api.rbac.v1.ClusterRole"),
    _k(group="rbac.authorization.k8s.io", version="v1", kind="ClusterRoleBinding",
       plural="clusterrolebindings", singular="clusterrolebinding", namespaced=False,
       definition="io.k8s.api.rbac.v1.ClusterRoleBinding"),
    _k(group="apiextensions.k8s.io", version="v1", kind="CustomResourceDefinition",
       plural="customresourcedefinitions", singular="customresourcedefinition",
       namespaced=False, short_names=("crd", "crds"), categories=("api-extensions",),
       subresources=("status",), has_generation=True,
       definition="io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.CustomResourceDefinition"),
)

# Preferred order of groups in discovery, as a real API server lists them.
GROUP_ORDER = (
    "", "apps", "events.k8s.io", "authentication.k8s.io", "authorization.k8s.io", "autoscaling",
    "batch", "networking.k8s.io", "policy", "rbac.authorization.k8s.io", "discovery.k8s.io",
    "apiextensions.k8s.io",
)


def kinds_from_crd(crd: dict[str, Any]) -> list[Kind]:
    """The kinds a CustomResourceDefinition object defines, one per served version."""
    spec = crd.get("spec", {})
    names = spec.get("names", {})
    group = spec.get("group", "")
    kinds = []
    for version in spec.get("versions", []):
        if not version.get("served", True):
            continue
        subresources = version.get("subresources") or {}
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        columns = tuple(
            PrinterColumn(
                name=c.get("name", ""),
                type=c.get("type", "string"),
                json_path=c.get("jsonPath", ""),
                description=c.get("description", ""),
                priority=int(c.get("priority", 0)),
                format=c.get("format", ""),
            )
            for c in version.get("additionalPrinterColumns") or []
        )
        kinds.append(
            Kind(
                group=group,
                version=version.get("name", "v1"),
                kind=names.get("kind", ""),
                plural=names.get("plural", ""),
                singular=names.get("singular") or names.get("kind", "").lower(),
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                short_names=tuple(names.get("shortNames") or ()),
                categories=tuple(names.get("categories") or ()),
                subresources=tuple(k for k in ("status", "scale") if k in subresources),
                has_generation=True,
                custom=True,
                schema=schema,
                printer_columns=columns,
                crd_name=crd.get("metadata", {}).get("name", ""),
            )
        )
    return kinds


class Registry:
    """The kinds being served right now: the built-ins plus those CRDs define."""

    def __init__(self) -> None:
        self._builtin = list(BUILTIN_KINDS)
        self._custom: dict[str, list[Kind]] = {}
        # Bumped whenever the set of kinds changes, so derived documents can be cached.
        self.revision = 0

    def __iter__(self) -> Iterator[Kind]:
        yield from self._builtin
        for kinds in self._custom.values():
            yield from kinds

    def set_crd(self, crd: dict[str, Any]) -> None:
        self._custom[crd["metadata"]["name"]] = kinds_from_crd(crd)
        self.revision += 1

    def remove_crd(self, name: str) -> None:
        if self._custom.pop(name, None) is not None:
            self.revision += 1

    def lookup(self, group: str, version: str, plural: str) -> Kind | None:
        for kind in self:
            if kind.group == group and kind.version == version and kind.plural == plural:
                return kind
        return None

    def storage_kind(self, group: str, plural: str) -> Kind | None:
        """The kind objects of (group, plural) are stored as (the first served version)."""
        for kind in self:
            if kind.group == group and kind.plural == plural:
                return kind
        return None

    def by_kind(self, api_version: str, kind_name: str) -> Kind | None:
        group = api_version.rpartition("/")[0]
        for kind in self:
            if kind.group == group and kind.kind == kind_name:
                return kind
        return None

    def groups(self) -> list[tuple[str, list[str]]]:
        """(group, versions) pairs in discovery order; the core group is ""."""
        seen: dict[str, list[str]] = {}
        for kind in self:
            versions = seen.setdefault(kind.group, [])
            if kind.version not in versions:
                versions.append(kind.version)
        order = {g: i for i, g in enumerate(GROUP_ORDER)}
        return sorted(seen.items(), key=lambda item: (order.get(item[0], len(order)), item[0]))

    def in_group_version(self, group: str, version: str) -> list[Kind]:
        return [k for k in self if k.group == group and k.version == version]
