"""One verdict for a set of objects: the worst status present, in Argo CD's order of severity
(Healthy < Suspended < Progressing < Missing < Degraded < Unknown), with a message that names the
worst objects — at most ``NAMED`` of them, each message cut to ``NAMED_MESSAGE`` characters, so the
roll-up of 10,000 failing pods is still one short line."""

from __future__ import annotations

from collections.abc import Iterable

from kasd.envgraph.health import HEALTHY, MISSING, SEVERITY, UNKNOWN, Health

__all__ = ["NAMED", "NAMED_MESSAGE", "rollup", "worse"]

NAMED = 3
NAMED_MESSAGE = 200

_RANK = {status: rank for rank, status in enumerate(SEVERITY)}


def _rank(status: str) -> int:
    # a status outside the vocabulary cannot be judged: as bad as Unknown
    return _RANK.get(status, _RANK[UNKNOWN])


def worse(a: str, b: str) -> bool:
    """Whether status ``b`` is worse than ``a`` (Argo's ``IsWorse``)."""
    return _rank(b) > _rank(a)


def _short(message: str) -> str:
    return message if len(message) <= NAMED_MESSAGE else message[: NAMED_MESSAGE - 1] + "…"


def rollup(healths: Iterable[Health | tuple[str, Health]]) -> Health:
    """The worst of ``healths``; each item a ``Health`` or a ``(node id, Health)`` pair (the graph
    passes pairs so the message can name objects). Empty → Missing, "nothing deployed".

    The message is ``"<id>: <message>"`` for each of the first ``NAMED`` worst objects in id order
    (just the message for a bare ``Health``; just the id when its message is empty), joined by
    ``"; "``, then ``"(and N more)"``; empty when all are Healthy. Cost: one pass, and a sort of the worst ones only."""
    worst_rank = -1
    worst: list[tuple[str, str]] = []
    for item in healths:
        name, health = item if isinstance(item, tuple) else ("", item)
        rank = _rank(health.status)
        if rank > worst_rank:
            worst_rank, worst = rank, []
        if rank == worst_rank:
            worst.append((name, health.message))
    if worst_rank < 0:
        return Health(MISSING, "nothing deployed")
    status = SEVERITY[worst_rank]
    if status == HEALTHY:
        return Health(HEALTHY)  # as Argo: nothing to explain
    worst.sort()
    parts = []
    for name, message in worst[:NAMED]:
        line = f"{name}: {message}" if name and message else name or message
        if line:
            parts.append(_short(line))
    more = len(worst) - NAMED
    if more > 0:
        parts.append(f"(and {more} more)")
    return Health(status, "; ".join(parts))
