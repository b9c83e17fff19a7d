"""Server-side field validation (`fieldValidation=Strict|Warn|Ignore`): unknown fields.

kubectl's default `--validate=strict` asks the server to refuse objects with fields the schema
does not declare; the API server answers with a "strict decoding error".
"""

from __future__ import annotations

from typing import Any

from kubesim.errors import ApiError, bad_request
from kubesim.openapi import definition_name, schema_definitions
from kubesim.resources import Kind, Registry


def unknown_fields(registry: Registry, kind: Kind, obj: dict[str, Any]) -> list[str]:
    defs = schema_definitions(registry)
    root = defs.get(definition_name(kind))
    if root is None:
        return []
    found: list[str] = []
    _walk(defs, root, obj, "", found)
    return found


def _resolve(defs: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    seen = 0
    while "$ref" in schema and seen < 8:
        schema = defs.get(schema["$ref"].rsplit("/", 1)[-1], {})
        seen += 1
    if "allOf" in schema and len(schema["allOf"]) == 1:
        return _resolve(defs, schema["allOf"][0])
    return schema


def _walk(defs: dict[str, Any], schema: dict[str, Any], value: Any, path: str, found: list[str]) -> None:
    schema = _resolve(defs, schema)
    if schema.get("x-kubernetes-preserve-unknown-fields") or schema.get("x-kubernetes-embedded-resource"):
        return
    if isinstance(value, dict):
        properties = schema.get("properties")
        additional = schema.get("additionalProperties")
        if properties is None:
            if isinstance(additional, dict):
                for key, item in value.items():
                    _walk(defs, additional, item, f"{path}.{key}" if path else key, found)
            return
        for key, item in value.items():
            child = f"{path}.{key}" if path else key
            if key not in properties:
                if not key.startswith("$"):
                    found.append(child)
                continue
            _walk(defs, properties[key], item, child, found)
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            for index, item in enumerate(value):
                _walk(defs, items, item, f"{path}[{index}]", found)


def check(registry: Registry, kind: Kind, obj: dict[str, Any], directive: str | None) -> list[str]:
    """Raise the strict decoding error, or return warnings for `Warn`."""
    mode = (directive or "").lower()
    if mode not in ("strict", "warn"):
        return []
    unknown = unknown_fields(registry, kind, obj)
    if not unknown:
        return []
    texts = [f'unknown field "{field}"' for field in unknown]
    if mode == "warn":
        return texts
    raise bad_request(
        f'{kind.kind} in version "{kind.version}" cannot be handled as a {kind.kind}: '
        f"strict decoding error: {', '.join(texts)}")


__all__ = ["ApiError", "check", "unknown_fields"]
