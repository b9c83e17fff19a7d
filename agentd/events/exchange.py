"""``ActionAttempt``: how one try of an event's action went."""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class ActionAttempt:
    """One try of one action: ``ok``, or why not; ``final`` when trying again cannot help."""

    ok: bool
    detail: str
    status: int | None = None
    final: bool = False


__all__ = ["ActionAttempt"]
