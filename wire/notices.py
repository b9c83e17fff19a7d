"""The NOTICE types (docs/protocol.md §9a) and how a receiver reads them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: kasd → agentd: the replicas an agent's connections belong on, home first
PLACEMENT = "placement"


def parse_placement(metadata: Mapping[str, Any]) -> list[tuple[str, str]] | None:
    """(name, url) pairs of a placement NOTICE in order, or None for anything else or malformed
    (a receiver ignores what it does not understand)."""
    if metadata.get("type") != PLACEMENT:
        return None
    replicas = metadata.get("replicas")
    if not isinstance(replicas, list) or not replicas or len(replicas) > 1000:
        return None
    out = []
    for entry in replicas:
        if not isinstance(entry, dict):
            return None
        name, url = entry.get("name"), entry.get("url")
        if not isinstance(name, str) or not isinstance(url, str) or not url:
            return None
        out.append((name, url))
    return out





__all__ = ["PLACEMENT", "parse_placement"]
