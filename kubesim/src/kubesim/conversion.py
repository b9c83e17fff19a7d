"""Conversion between the versions of a built-in kind served in more than one version.

Objects are stored in the first version the registry lists for their resource (the preferred
one); requests in another version are converted on the way in and out, as the API server does.
Only HorizontalPodAutoscaler needs it: kubectl 1.32's `autoscale` still speaks autoscaling/v1.
"""

from __future__ import annotations

import copy
from typing import Any

from kubesim.resources import Kind


def to_storage(kind: Kind, obj: dict[str, Any], storage: Kind) -> dict[str, Any]:
    if kind.version == storage.version:
        return obj
    if kind.plural == "horizontalpodautoscalers" and kind.version == "v1":
        return _hpa_v1_to_v2(obj)
    return obj


def from_storage(kind: Kind, obj: dict[str, Any], storage: Kind) -> dict[str, Any]:
    if kind.version == storage.version:
        return obj
    if kind.plural == "horizontalpodautoscalers" and kind.version == "v1":
        return _hpa_v2_to_v1(obj)
    return obj


def _hpa_v1_to_v2(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    spec = out.get("spec")
    if isinstance(spec, dict) and "targetCPUUtilizationPercentage" in spec:
        target = spec.pop("targetCPUUtilizationPercentage")
        spec["metrics"] = [{"type": "Resource", "resource": {
            "name": "cpu", "target": {"type": "Utilization", "averageUtilization": target}}}]
    status = out.get("status")
    if isinstance(status, dict) and "currentCPUUtilizationPercentage" in status:
        current = status.pop("currentCPUUtilizationPercentage")
        status["currentMetrics"] = [{"type": "Resource", "resource": {
            "name": "cpu", "current": {"averageUtilization": current}}}]
    return out


def _hpa_v2_to_v1(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    spec = out.get("spec")
    if isinstance(spec, dict):
        metrics = spec.pop("metrics", None) or []
        spec.pop("behavior", None)
        for metric in metrics:
            resource = metric.get("resource") or {}
            if metric.get("type") == "Resource" and resource.get("name") == "cpu":
                utilization = (resource.get("target") or {}).get("averageUtilization")
                if utilization is not None:
                    spec["targetCPUUtilizationPercentage"] = utilization
    status = out.get("status")
    if isinstance(status, dict):
        current = status.pop("currentMetrics", None) or []
        status.pop("conditions", None)
        for metric in current:
            resource = metric.get("resource") or {}
            if resource.get("name") == "cpu":
                value = (resource.get("current") or {}).get("averageUtilization")
                if value is not None:
                    status["currentCPUUtilizationPercentage"] = value
    return out
