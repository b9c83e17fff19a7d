"""What the side that accepts a logical stream does when it has no handler for the stream's kind
(``tunnelhttp.kinds``): REFUSE it with ``UNKNOWN_TARGET``, naming the kind. One place, so agentd
(``agentd.streams``) and kasd (``kasd.agents``) refuse alike.

May import: ``tunnelhttp.head`` (the refusal code), ``wire`` (a stream), trio.
"""

from __future__ import annotations

import trio

from tunnelhttp.head import TunnelCode
from wire.errors import RemoteProtocolError
from wire.session import MuxStream


def shown_kind(kind: object) -> str:
    """A stream's ``kind`` as a message may show it (a peer's string, cut; else its type)."""
    return kind[:64] if isinstance(kind, str) else type(kind).__name__


async def refuse_unknown_kind(stream: MuxStream, who: str) -> None:
    """REFUSE ``stream`` with ``UNKNOWN_TARGET``: ``who`` (``kasd``, ``agentd``) has no handler for its
    kind, which the message names; a stream already gone is left alone."""
    shown = shown_kind(stream.metadata.get("kind"))
    try:
        await stream.refuse(TunnelCode.UNKNOWN_TARGET, f"{who} has no handler for kind {shown!r}")
    except (trio.BrokenResourceError, trio.ClosedResourceError, RemoteProtocolError):
        pass


__all__ = ["refuse_unknown_kind", "shown_kind"]
