"""``StreamKinds``: the handler of every logical stream kasd opens, which hands each to the handler
of its kind (the OPEN metadata's ``kind``, ``tunnelhttp.kinds``; none means ``k8s-api``, as in
protocol 1.0) and REFUSEs a kind agentd has no handler for with ``UNKNOWN_TARGET``, naming it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

import trio

from tunnelhttp.dispatch import refuse_unknown_kind, shown_kind
from tunnelhttp.kinds import KIND_K8S_API
from wire.session import MuxStream

log = logging.getLogger("agentd.streams")

StreamHandler = Callable[[MuxStream], Awaitable[None]]


class StreamKinds:
    """``await kinds(stream)``: serve ``stream`` with the handler of its kind."""

    def __init__(self, handlers: Mapping[str, StreamHandler]) -> None:
        self.handlers = dict(handlers)

    async def __call__(self, stream: MuxStream) -> None:
        kind = stream.metadata.get("kind", KIND_K8S_API)
        handler = self.handlers.get(kind) if isinstance(kind, str) else None
        if handler is not None:
            await handler(stream)
            return
        log.warning("refusing stream stream=%d reason=unknown-kind kind=%r", stream.stream_id, shown_kind(kind))
        try:
            await refuse_unknown_kind(stream, "agentd")
        finally:
            with trio.move_on_after(1, shield=True):
                await stream.aclose()


__all__ = ["StreamHandler", "StreamKinds"]
