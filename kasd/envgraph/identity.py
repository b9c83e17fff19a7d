"""Who an object is: its node id and the typed reads of the few fields every rule needs.

Objects arrive as the API server answered them (JSON decoded into dicts), through an agent that is
trusted no further than the cluster it fronts; every read here tolerates a field of the wrong type
(it reads as absent) so that one odd object can never raise out of the graph.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["group_version", "identity", "mapping", "node_id", "seq", "text"]


def mapping(value: object) -> Mapping[str, Any]:
    """``value`` if it is a JSON object, else an empty one."""
    return value if isinstance(value, Mapping) else {}


def seq(value: object) -> Sequence[Any]:
    """``value`` if it is a JSON array, else an empty one (a string is not an array)."""
    return value if isinstance(value, list | tuple) else ()


def text(value: object) -> str:
    """``value`` if it is a string, else ``""``."""
    return value if isinstance(value, str) else ""


def group_version(api_version: str) -> tuple[str, str]:
    """``"apps/v1"`` → ``("apps", "v1")``; the core group's ``"v1"`` → ``("", "v1")``."""
    group, _, version = api_version.rpartition("/")
    return group, version


def identity(obj: Mapping[str, Any]) -> tuple[str, str, str, str, str]:
    """(group, version, kind, namespace, name) of ``obj``; empty strings where absent."""
    group, version = group_version(text(obj.get("apiVersion")))
    meta = mapping(obj.get("metadata"))
    return group, version, text(obj.get("kind")), text(meta.get("namespace")), text(meta.get("name"))


def node_id(obj: Mapping[str, Any]) -> str:
    """``"<group>/<Kind>/<namespace>/<name>"``: ``"apps/Deployment/prod/hello"``,
    ``"/Pod/prod/hello-7d9-abc"``, ``"/PersistentVolume//pv-1"`` (core group and cluster scope are
    empty strings). The version is not part of it: one object served at two versions is one node."""
    group, _version, kind, namespace, name = identity(obj)
    return f"{group}/{kind}/{namespace}/{name}"
