"""The three PATCH flavours: JSON merge (RFC 7386), JSON patch (RFC 6902) and strategic merge.

Strategic merge is what `kubectl apply`, `kubectl patch` and `kubectl label` send for built-in
kinds: maps merge, lists with a merge key (containers by name, ports by containerPort, …) merge
element-wise, `null` deletes, and the `$patch`, `$setElementOrder/…`, `$retainKeys` and
`$deleteFromPrimitiveList/…` directives shape the result.
"""

from __future__ import annotations

import copy
from typing import Any

from kubesim.errors import ApiError, bad_request, unsupported_media_type

# Field name → merge key. The API types declare these per field; the names below are unique
# enough across the kinds served that the field name alone decides.
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "conditions": "type",
    "ownerReferences": "uid",
    "topologySpreadConstraints": "topologyKey",
    "resourceClaims": "name",
    "secrets": "name",
    "readinessGates": "conditionType",
}
# Lists of scalars that merge as sets rather than being replaced.
MERGED_SCALAR_LISTS = {"finalizers"}


def _port_key(path: tuple[str, ...]) -> str:
    # Container ports merge by containerPort, Service ports by port.
    return "containerPort" if "containers" in path or "initContainers" in path else "port"


def merge_key(path: tuple[str, ...], field: str) -> str | None:
    if field == "ports":
        return _port_key(path)
    return MERGE_KEYS.get(field)


MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


def apply_patch(content_type: str, original: dict[str, Any], patch: Any, *, custom: bool) -> dict[str, Any]:
    media = content_type.split(";")[0].strip().lower()
    if media == MERGE_PATCH:
        if not isinstance(patch, dict):
            raise bad_request("merge patch must be a JSON object")
        return merge_patch(original, patch)
    if media == JSON_PATCH:
        if not isinstance(patch, list):
            raise bad_request("json patch must be a JSON array of operations")
        return json_patch(original, patch)
    if media == STRATEGIC_PATCH:
        if custom:
            raise unsupported_media_type(
                f"the body of the request was in an unknown format - accepted media types include: "
                f"{JSON_PATCH}, {MERGE_PATCH}, {APPLY_PATCH}")
        if not isinstance(patch, dict):
            raise bad_request("strategic merge patch must be a JSON object")
        return strategic_merge(original, patch)
    if media == APPLY_PATCH:
        raise unsupported_media_type(
            "kubesim does not implement server-side apply (application/apply-patch+yaml); "
            "use client-side `kubectl apply` (without --server-side) instead")
    raise unsupported_media_type(
        f"the body of the request was in an unknown format - accepted media types include: "
        f"{JSON_PATCH}, {MERGE_PATCH}, {STRATEGIC_PATCH}")


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# -- RFC 6902 -----------------------------------------------------------------------------------


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(f"invalid JSON pointer: {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], op: str) -> tuple[Any, str]:
    node = doc
    for part in parts[:-1]:
        if isinstance(node, list):
            try:
                node = node[int(part)]
            except (ValueError, IndexError) as exc:
                raise _patch_error(op, parts) from exc
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise _patch_error(op, parts)
    return node, parts[-1]


def _patch_error(op: str, parts: list[str]) -> ApiError:
    return ApiError(422, "Invalid", f"the server rejected our request due to an error in our request: "
                    f"doc is missing path: \"/{'/'.join(parts)}\"" if op != "test" else "testing value failed")


def _get(doc: Any, parts: list[str], op: str) -> Any:
    if not parts:
        return doc
    parent, last = _parent(doc, parts, op)
    try:
        return parent[int(last)] if isinstance(parent, list) else parent[last]
    except (KeyError, ValueError, IndexError, TypeError) as exc:
        raise _patch_error(op, parts) from exc


def _remove(doc: Any, parts: list[str], op: str) -> Any:
    parent, last = _parent(doc, parts, op)
    try:
        return parent.pop(int(last)) if isinstance(parent, list) else parent.pop(last)
    except (KeyError, ValueError, IndexError, TypeError) as exc:
        raise _patch_error(op, parts) from exc


def _add(doc: Any, parts: list[str], value: Any, op: str, *, replace: bool = False) -> Any:
    if not parts:
        return value
    parent, last = _parent(doc, parts, op)
    if isinstance(parent, list):
        if last == "-":
            parent.append(value)
            return doc
        try:
            index = int(last)
        except ValueError as exc:
            raise _patch_error(op, parts) from exc
        if replace:
            if not 0 <= index < len(parent):
                raise _patch_error(op, parts)
            parent[index] = value
        else:
            if not 0 <= index <= len(parent):
                raise _patch_error(op, parts)
            parent.insert(index, value)
    elif isinstance(parent, dict):
        if replace and last not in parent:
            raise _patch_error(op, parts)
        parent[last] = value
    else:
        raise _patch_error(op, parts)
    return doc


def json_patch(target: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    doc: Any = copy.deepcopy(target)
    for operation in operations:
        op = operation.get("op")
        parts = _pointer(operation.get("path", ""))
        if op == "add":
            doc = _add(doc, parts, copy.deepcopy(operation.get("value")), op)
        elif op == "remove":
            _remove(doc, parts, op)
        elif op == "replace":
            doc = _add(doc, parts, copy.deepcopy(operation.get("value")), op, replace=True)
        elif op == "move":
            value = _remove(doc, _pointer(operation.get("from", "")), op)
            doc = _add(doc, parts, value, op)
        elif op == "copy":
            value = copy.deepcopy(_get(doc, _pointer(operation.get("from", "")), op))
            doc = _add(doc, parts, value, op)
        elif op == "test":
            if _get(doc, parts, op) != operation.get("value"):
                raise ApiError(422, "Invalid", "the server rejected our request due to an error in our request: testing value failed")
        else:
            raise bad_request(f"Unexpected kind: {op}")
    return doc


# -- strategic merge ----------------------------------------------------------------------------


def strategic_merge(original: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    return _merge_map(copy.deepcopy(original), patch, ())


def _merge_map(original: dict[str, Any], patch: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return {}
    retain = patch.get("$retainKeys")
    orders: dict[str, list[Any]] = {}
    for key, value in patch.items():
        if key.startswith("$setElementOrder/"):
            orders[key.split("/", 1)[1]] = value
        elif key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if isinstance(original.get(field), list):
                original[field] = [v for v in original[field] if v not in value]
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            original.pop(key, None)
            continue
        current = original.get(key)
        if isinstance(value, dict) and isinstance(current, dict):
            original[key] = _merge_map(current, value, (*path, key))
        elif isinstance(value, dict):
            original[key] = _merge_map({}, value, (*path, key))
        elif isinstance(value, list):
            original[key] = _merge_list(current if isinstance(current, list) else [], value,
                                        (*path, key), key)
        else:
            original[key] = copy.deepcopy(value)
    for field, order in orders.items():
        if isinstance(original.get(field), list):
            original[field] = _apply_order(original[field], order, merge_key(path, field))
    if isinstance(retain, list):
        original = {k: v for k, v in original.items() if k in retain}
    return original


def _merge_list(current: list[Any], patch: list[Any], path: tuple[str, ...], field: str) -> list[Any]:
    key = merge_key(path[:-1], field)
    if key is None:
        if field in MERGED_SCALAR_LISTS:
            merged = list(current)
            merged.extend(v for v in patch if v not in merged)
            return merged
        if any(isinstance(v, dict) and v.get("$patch") == "replace" for v in patch):
            return [v for v in patch if not (isinstance(v, dict) and "$patch" in v)]
        return copy.deepcopy(patch)
    if any(isinstance(v, dict) and v.get("$patch") == "replace" for v in patch):
        return [copy.deepcopy(v) for v in patch if not (isinstance(v, dict) and "$patch" in v)]
    merged = [copy.deepcopy(v) for v in current]
    for item in patch:
        if not isinstance(item, dict):
            merged.append(copy.deepcopy(item))
            continue
        index = next((i for i, v in enumerate(merged)
                      if isinstance(v, dict) and key in item and v.get(key) == item.get(key)), None)
        if item.get("$patch") == "delete":
            if index is not None:
                merged.pop(index)
            continue
        if index is None:
            merged.append(_merge_map({}, item, path))
        else:
            merged[index] = _merge_map(merged[index], item, path)
    return merged


def _apply_order(items: list[Any], order: list[Any], key: str | None) -> list[Any]:
    def ident(item: Any) -> Any:
        if key and isinstance(item, dict):
            return item.get(key)
        return item

    wanted = [ident(o) for o in order]
    position = {value: i for i, value in enumerate(wanted) if _hashable(value)}
    ordered = sorted(
        enumerate(items),
        key=lambda pair: (position.get(ident(pair[1]), len(position) + pair[0])
                          if _hashable(ident(pair[1])) else len(position) + pair[0]),
    )
    return [item for _, item in ordered]


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True
