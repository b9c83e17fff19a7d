"""Small readers and builders of object fields the controllers share: ownership, readiness,
conditions, knobs, percentages and the pod-template hash."""

from __future__ import annotations

import hashlib
import math
from typing import Any

from kubesim.resources import Kind


def template_hash(template: dict[str, Any]) -> str:
    digest = hashlib.sha256(repr(_canonical(template)).encode()).digest()
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    number = int.from_bytes(digest[:8], "big")
    chars = []
    for _ in range(10):
        number, rest = divmod(number, len(alphabet))
        chars.append(alphabet[rest])
    return "".join(chars)


def _canonical(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _canonical(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_canonical(v) for v in value)
    return value


def owned_by(obj: dict[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid and ref.get("controller")
               for ref in obj.get("metadata", {}).get("ownerReferences") or [])


def owner_ref(kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": kind.api_version, "kind": kind.kind, "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def annotation_true(obj: dict[str, Any], key: str) -> bool:
    return (obj.get("metadata", {}).get("annotations") or {}).get(key, "").lower() == "true"


def pod_ready(pod: dict[str, Any]) -> bool:
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    for entry in (pod.get("status") or {}).get("conditions") or []:
        if entry.get("type") == "Ready":
            return entry.get("status") == "True"
    return False


def condition(kind: str, status: str, reason: str, message: str, old: list[dict[str, Any]] | None,
               *, stamp: str, update_time: bool = False) -> dict[str, Any]:
    previous = next((c for c in old or [] if c.get("type") == kind), None)
    transition = stamp
    if previous and previous.get("status") == status:
        transition = previous.get("lastTransitionTime", stamp)
    condition = {"type": kind, "status": status, "reason": reason, "message": message,
                 "lastTransitionTime": transition}
    if update_time:
        last_update = stamp
        if previous and previous.get("status") == status and previous.get("reason") == reason:
            last_update = previous.get("lastUpdateTime", stamp)
        condition["lastUpdateTime"] = last_update
    return condition


def percent(value: Any, total: int, *, round_up: bool) -> int:
    if isinstance(value, int):
        return value
    text = str(value or "0")
    if text.endswith("%"):
        fraction = int(text[:-1]) * total / 100
        return math.ceil(fraction) if round_up else math.floor(fraction)
    return int(text)
