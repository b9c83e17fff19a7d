"""Regenerate `definitions.json`, the OpenAPI schemas of the served kinds.

The schemas come from the models of the official Python `kubernetes` client (a dev
dependency), so kubesim itself does not need that package at run time:

    python -m kubesim.definitions_build
"""

from __future__ import annotations

import json
import re
from collections import deque
from pathlib import Path
from typing import Any

# Top-level kinds: (client class, definition name, group, version, kind)
TOP_LEVEL = [
    ("V1Namespace", "io.k8s.api.core.v1.Namespace", "", "v1", "Namespace"),
    ("V1Node", "io.k8s.api.core.v1.Node", "", "v1", "Node"),
    ("V1Pod", "io.k8s.api.core.v1.Pod", "", "v1", "Pod"),
    ("V1Service", "io.k8s.api.core.v1.Service", "", "v1", "Service"),
    ("V1ConfigMap", "io.k8s.api.core.v1.ConfigMap", "", "v1", "ConfigMap"),
    ("V1Secret", "io.k8s.api.core.v1.Secret", "", "v1", "Secret"),
    ("CoreV1Event", "io.k8s.api.core.v1.Event", "", "v1", "Event"),
    ("V1PersistentVolumeClaim", "io.k8s.api.core.v1.PersistentVolumeClaim", "", "v1", "PersistentVolumeClaim"),
    ("V1ServiceAccount", "io.k8s.api.core.v1.ServiceAccount", "", "v1", "ServiceAccount"),
    ("V1Deployment", "io.k8s.api.apps.v1.Deployment", "apps", "v1", "Deployment"),
    ("V1ReplicaSet", "io.k8s.api.apps.v1.ReplicaSet", "apps", "v1", "ReplicaSet"),
    ("V1StatefulSet", "io.k8s.api.apps.v1.StatefulSet", "apps", "v1", "StatefulSet"),
    ("V1DaemonSet", "io.k8s.api.apps.v1.DaemonSet", "apps", "v1", "DaemonSet"),
    ("V1ControllerRevision", "io.k8s.api.apps.v1.ControllerRevision", "apps", "v1", "ControllerRevision"),
    ("V1Job", "io.k8s.api.batch.v1.Job", "batch", "v1", "Job"),
    ("V1CronJob", "io.k8s.api.batch.v1.CronJob", "batch", "v1", "CronJob"),
    ("V1EndpointSlice", "io.k8s.api.discovery.v1.EndpointSlice", "discovery.k8s.io", "v1", "EndpointSlice"),
    ("V1Ingress", "io.k8s.api.networking.v1.Ingress", "networking.k8s.io", "v1", "Ingress"),
    ("V1NetworkPolicy", "io.k8s.api.networking.v1.NetworkPolicy", "networking.k8s.io", "v1", "NetworkPolicy"),
    ("V1PodDisruptionBudget", "io.k8s.api.policy.v1.PodDisruptionBudget", "policy", "v1", "PodDisruptionBudget"),
    ("V2HorizontalPodAutoscaler", "io.k8s.api.autoscaling.v2.HorizontalPodAutoscaler", "autoscaling", "v2", "HorizontalPodAutoscaler"),
    ("V1HorizontalPodAutoscaler", "io.k8s.api.autoscaling.v1.HorizontalPodAutoscaler", "autoscaling", "v1", "HorizontalPodAutoscaler"),
    ("V1CustomResourceDefinition", "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.CustomResourceDefinition", "apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
    ("V1Scale", "io.k8s.api.autoscaling.v1.Scale", "autoscaling", "v1", "Scale"),
    ("V1Role", "io.k8s.api.rbac.v1.Role", "rbac.authorization.k8s.io", "v1", "Role"),
    ("V1RoleBinding", "io.k8s.api.rbac.v1.RoleBinding", "rbac.authorization.k8s.io", "v1", "RoleBinding"),
    ("V1ClusterRole", "io.k8s.api.rbac.v1.ClusterRole", "rbac.authorization.k8s.io", "v1", "ClusterRole"),
    ("V1ClusterRoleBinding", "io.k8s.api.rbac.v1.ClusterRoleBinding", "rbac.authorization.k8s.io", "v1",
     "ClusterRoleBinding"),
]
META = {"V1ObjectMeta", "V1ListMeta", "V1OwnerReference", "V1ManagedFieldsEntry", "V1LabelSelector",
        "V1LabelSelectorRequirement", "V1Status", "V1StatusDetails", "V1StatusCause",
        "V1DeleteOptions", "V1Preconditions", "V1Condition"}
PACKAGES = {"": "io.k8s.api.core", "apps": "io.k8s.api.apps", "batch": "io.k8s.api.batch",
            "discovery.k8s.io": "io.k8s.api.discovery", "networking.k8s.io": "io.k8s.api.networking",
            "policy": "io.k8s.api.policy",
            "autoscaling": "io.k8s.api.autoscaling", "rbac.authorization.k8s.io": "io.k8s.api.rbac",
            "apiextensions.k8s.io": "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions"}
_PREFIX = re.compile(r"^(?:[A-Z][a-z]+)?(V\d+(?:alpha\d+|beta\d+)?)(.+)$")


def build() -> dict[str, Any]:
    import kubernetes.client as client

    names: dict[str, str] = {}
    queue: deque[tuple[str, str]] = deque()
    for cls, definition, group, _, _ in TOP_LEVEL:
        names[cls] = definition
        queue.append((cls, group))
    definitions: dict[str, Any] = {}

    def ref_name(cls: str, group: str) -> str:
        if cls not in names:
            match = _PREFIX.match(cls)
            version, short = (match.group(1).lower(), match.group(2)) if match else ("v1", cls)
            if cls in META:
                names[cls] = f"io.k8s.apimachinery.pkg.apis.meta.v1.{short}"
            else:
                names[cls] = f"{PACKAGES.get(group, 'io.k8s.api.core')}.{version}.{short}"
            queue.append((cls, group))
        return names[cls]

    def schema_for(type_text: str, model: Any, field: str, group: str) -> dict[str, Any]:
        if type_text.startswith("List["):
            return {"type": "array", "items": schema_for(type_text[5:-1], None, "", group)}
        if type_text.startswith("Dict["):
            inner = type_text[5:-1].split(",", 1)[1].strip()
            return {"type": "object", "additionalProperties": schema_for(inner, None, "", group)}
        match type_text:
            case "str":
                return {"type": "string"}
            case "int":
                return {"type": "integer", "format": "int64"}
            case "float":
                return {"type": "number", "format": "double"}
            case "bool":
                return {"type": "boolean"}
            case "datetime":
                return {"type": "string", "format": "date-time"}
            case "bytearray":
                return {"type": "string", "format": "byte"}
            case "object":
                annotation = str(model.model_fields[field].annotation) if model is not None and field in model.model_fields else ""
                if "int" in annotation and "str" in annotation:
                    return {"type": "string", "format": "int-or-string"}
                return {"type": "object"}
        if hasattr(client, type_text):
            return {"$ref": "#/definitions/" + ref_name(type_text, group)}
        return {"type": "object"}

    while queue:
        cls, group = queue.popleft()
        name = names[cls]
        if name in definitions:
            continue
        model = getattr(client, cls)
        properties = {}
        required = []
        for attr, type_text in model.openapi_types.items():
            json_name = model.attribute_map[attr]
            properties[json_name] = schema_for(type_text, model, attr, group)
            info = model.model_fields.get(attr)
            if info is not None and info.description:
                # kubectl explain prints these.
                properties[json_name]["description"] = info.description
            if info is not None and info.is_required():
                required.append(json_name)
        entry: dict[str, Any] = {"type": "object", "properties": properties}
        doc = " ".join((model.__doc__ or "").strip().split("\n\n")[0].split())
        if doc and not doc.startswith(("Attributes", "NOTE", cls)):
            entry["description"] = doc
        if required:
            entry["required"] = required
        definitions[name] = entry
    for _, top, group, version, kind in TOP_LEVEL:
        definitions[top]["x-kubernetes-group-version-kind"] = [
            {"group": group, "version": version, "kind": kind}]
    return definitions


def main() -> None:
    path = Path(__file__).with_name("definitions.json")
    path.write_text(json.dumps(build(), sort_keys=True, separators=(",", ":")) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
