"""OpenAPI documents: /openapi/v2 (JSON) and /openapi/v3 with one document per group-version.

The schemas come from `definitions.json` (see `definitions_build`) plus each CRD's
openAPIV3Schema. Every kind's PATCH path declares the `fieldValidation` query parameter, which
tells kubectl to leave `--validate=strict` to the server (see `fieldcheck`), as it does with a
real API server.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
from importlib import resources as importlib_resources
from typing import Any

from kubesim.patch import MERGE_KEYS, MERGED_SCALAR_LISTS
from kubesim.resources import Kind, Registry

KUBE_VERSION = "v1.32.0"
_META = "io.k8s.apimachinery.pkg.apis.meta.v1"


@functools.cache
def definitions() -> dict[str, Any]:
    text = importlib_resources.files("kubesim").joinpath("definitions.json").read_text()
    defs: dict[str, Any] = json.loads(text)
    for name, definition in defs.items():
        for prop, schema in (definition.get("properties") or {}).items():
            if schema.get("type") != "array":
                continue
            key = MERGE_KEYS.get(prop)
            if prop == "ports":
                key = "containerPort" if name.endswith((".ContainerPort", ".Container")) else "port"
            if key:
                schema["x-kubernetes-patch-merge-key"] = key
                schema["x-kubernetes-patch-strategy"] = "merge"
            elif prop in MERGED_SCALAR_LISTS:
                schema["x-kubernetes-patch-strategy"] = "merge"
    defs[f"{_META}.Patch"] = {"type": "object"}
    return defs


def _custom_schema(kind: Kind) -> dict[str, Any]:
    schema: dict[str, Any] = copy.deepcopy(kind.schema) if kind.schema else {
        "type": "object", "x-kubernetes-preserve-unknown-fields": True}
    properties: dict[str, Any] = schema.setdefault("properties", {})
    properties["apiVersion"] = {"type": "string"}
    properties["kind"] = {"type": "string"}
    properties["metadata"] = {"$ref": f"#/definitions/{_META}.ObjectMeta"}
    schema["x-kubernetes-group-version-kind"] = [
        {"group": kind.group, "version": kind.version, "kind": kind.kind}]
    return schema


def definition_name(kind: Kind) -> str:
    if kind.custom:
        reversed_group = ".".join(reversed(kind.group.split(".")))
        return f"{reversed_group}.{kind.version}.{kind.kind}"
    return kind.definition


_cache: dict[tuple[int, int, str], Any] = {}


def _cached(registry: Registry, what: str, build: Any) -> Any:
    key = (id(registry), registry.revision, what)
    if key not in _cache:
        if len(_cache) > 256:
            _cache.clear()
        _cache[key] = build()
    return _cache[key]


def schema_definitions(registry: Registry) -> dict[str, Any]:
    return _cached(registry, "defs", lambda: _schema_definitions(registry))


def _schema_definitions(registry: Registry) -> dict[str, Any]:
    defs = dict(definitions())
    for kind in registry:
        if kind.custom:
            defs[definition_name(kind)] = _custom_schema(kind)
    return defs


def _parameters(kind: Kind, v3: bool) -> list[dict[str, Any]]:
    def param(name: str) -> dict[str, Any]:
        if v3:
            return {"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
        return {"name": name, "in": "query", "type": "string", "uniqueItems": True}

    return [param("dryRun"), param("fieldManager"), param("fieldValidation"), param("force")]


def _operation(kind: Kind, gvk: dict[str, str], response: dict[str, Any], v3: bool, action: str,
               op_id: str, *, params: bool = True, request: Any = None) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "operationId": op_id, "responses": response,
        "x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk,
        "tags": [f"{kind.group or 'core'}_{kind.version}"],
    }
    if params:
        operation["parameters"] = _parameters(kind, v3)
    if request is not None:
        operation["requestBody"] = request
    return operation


def _paths(kinds: list[Kind], *, v3: bool) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    ref_prefix = "#/components/schemas/" if v3 else "#/definitions/"
    for kind in kinds:
        if kind.virtual:
            continue
        gvk = {"group": kind.group, "version": kind.version, "kind": kind.kind}
        prefix = f"/apis/{kind.group}/{kind.version}" if kind.group else f"/api/{kind.version}"
        collection = f"{prefix}/namespaces/{{namespace}}/{kind.plural}" if kind.namespaced else f"{prefix}/{kind.plural}"
        item = f"{collection}/{{name}}"
        ref = {"$ref": ref_prefix + definition_name(kind)}
        if v3:
            response = {"200": {"description": "OK", "content": {"application/json": {"schema": ref}}}}
            body = {"content": {"application/json": {"schema": ref}}, "required": True}
            # Custom resources take no strategic merge patch; kubectl reads that from here.
            patch_types = ["application/json-patch+json", "application/merge-patch+json",
                           "application/apply-patch+yaml"]
            if not kind.custom:
                patch_types.insert(2, "application/strategic-merge-patch+json")
            patch_body = {"content": {t: {"schema": {"$ref": f"{ref_prefix}{_META}.Patch"}}
                                      for t in patch_types}, "required": True}
        else:
            response = {"200": {"description": "OK", "schema": ref}}
            body = None
            patch_body = None

        name = kind.kind
        op = functools.partial(_operation, kind, gvk, response, v3)
        paths[collection] = {
            "get": op("list", f"list{name}", params=False),
            "post": op("post", f"create{name}", request=body),
        }
        paths[item] = {
            "get": op("get", f"read{name}", params=False),
            "put": op("put", f"replace{name}", request=body),
            "patch": op("patch", f"patch{name}", request=patch_body),
            "delete": op("delete", f"delete{name}", params=False),
        }
    return paths


def _rewrite_refs(node: Any) -> Any:
    """v2 schemas to v3: refs point into components and are wrapped in `allOf` as the API
    server publishes them (kubectl explain follows only that form)."""
    if isinstance(node, dict):
        if set(node) == {"$ref"} and isinstance(node["$ref"], str):
            target = node["$ref"].replace("#/definitions/", "#/components/schemas/")
            return {"allOf": [{"$ref": target}], "default": {}}
        return {key: _rewrite_refs(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_rewrite_refs(v) for v in node]
    return node


def v2_document(registry: Registry) -> dict[str, Any]:
    return _cached(registry, "v2", lambda: _v2_document(registry))


def _v2_document(registry: Registry) -> dict[str, Any]:
    defs = {k: _v2_schema(v) for k, v in schema_definitions(registry).items()}
    return {"swagger": "2.0", "info": {"title": "Kubernetes", "version": KUBE_VERSION},
            "paths": _paths(list(registry), v3=False), "definitions": defs}


def _v2_schema(schema: Any) -> Any:
    # Swagger 2.0 has no int-or-string type marker beyond the format.
    return schema


def _group_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def v3_document(registry: Registry, group: str, version: str) -> dict[str, Any] | None:
    return _cached(registry, f"v3:{group}/{version}", lambda: _v3_document(registry, group, version))


def _v3_document(registry: Registry, group: str, version: str) -> dict[str, Any] | None:
    kinds = registry.in_group_version(group, version)
    if not kinds:
        return None
    all_schemas = _cached(registry, "v3schemas", lambda: _rewrite_refs(schema_definitions(registry)))
    roots = [definition_name(k) for k in kinds if not k.virtual] + [f"{_META}.Patch"]
    schemas = {name: all_schemas[name] for name in _reachable(all_schemas, roots)}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": KUBE_VERSION},
            "paths": _paths(kinds, v3=True), "components": {"schemas": schemas}}


def _reachable(schemas: dict[str, Any], roots: list[str]) -> list[str]:
    """The schemas `roots` refer to, transitively (a GV's document carries only those)."""
    seen: set[str] = set()
    stack = [r for r in roots if r in schemas]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        pending = [schemas[name]]
        while pending:
            node = pending.pop()
            if isinstance(node, dict):
                ref = node.get("$ref")
                if isinstance(ref, str):
                    target = ref.rsplit("/", 1)[-1]
                    if target in schemas and target not in seen:
                        stack.append(target)
                pending.extend(node.values())
            elif isinstance(node, list):
                pending.extend(node)
    return sorted(seen)


def v3_hash(registry: Registry, group: str, version: str) -> str:
    return _cached(registry, f"hash:{group}/{version}", lambda: _v3_hash(registry, group, version))


def _v3_hash(registry: Registry, group: str, version: str) -> str:
    document = v3_document(registry, group, version)
    return hashlib.sha512(json.dumps(document, sort_keys=True).encode()).hexdigest()[:64].upper()


def v3_root(registry: Registry) -> dict[str, Any]:
    paths = {}
    for group, versions in registry.groups():
        for version in versions:
            path = _group_path(group, version)
            paths[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={v3_hash(registry, group, version)}"}
    return {"paths": paths}


def v3_path_to_group_version(path: str) -> tuple[str, str] | None:
    parts = path.strip("/").split("/")
    if len(parts) == 2 and parts[0] == "api":
        return "", parts[1]
    if len(parts) == 3 and parts[0] == "apis":
        return parts[1], parts[2]
    return None
