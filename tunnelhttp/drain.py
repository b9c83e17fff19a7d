"""Ending endless responses at an event boundary when a daemon drains (Trio adapter).

Finite responses are left to finish within the drain's grace. A watch or a followed log would only
hold the drain until its grace ran out and then end in a reset, which clients show as a stream
error; instead, once the drain begins, each one ends cleanly at its next event boundary
(``tunnelhttp.watchbounds``): at once if it is waiting between events, else right after the event that is
passing through.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from tunnelhttp.head import RequestHead, ResponseHead
from tunnelhttp.watchbounds import EventBoundary

__all__ = ["Drain", "answer_boundary"]


def answer_boundary(request: RequestHead, head: ResponseHead) -> EventBoundary | None:
    """Where a watch or followed log may end when a daemon drains; None for an answer that ends.
    (kasd's proxy and the holder side of the kasd-to-kasd hop both cut there.) An upgraded answer
    (``101``) has none, whatever its target says: its bytes are WebSocket or SPDY frames, not
    events, and it ends when its ends do."""
    if head.status == 101:
        return None
    content_type = None
    for name, value in head.headers:  # a loop, not next(generator): no Python call per header
        if name.lower() == "content-type":
            content_type = value
            break
    return EventBoundary.for_response(request.target, content_type)


class Drain:
    def __init__(self) -> None:
        self.started = False
        self._waiting: set[trio.CancelScope] = set()

    def begin(self) -> None:
        """End every endless response at its next boundary (idempotent)."""
        self.started = True
        for scope in self._waiting:
            scope.cancel()

    async def next_chunk(self, receive: Callable[[], Awaitable[bytes]], boundary: EventBoundary | None) -> bytes | None:
        """``receive()``'s next chunk (``b""`` at the end), or None: the drain began and the body
        may end here. Without a boundary (a response that ends by itself) this is ``receive()``."""
        if boundary is None:
            return await receive()
        if not boundary.at_boundary:
            data = await receive()  # mid-event: the rest of it goes out whatever happens
        elif self.started:
            return None
        else:
            with trio.CancelScope() as scope:
                self._waiting.add(scope)
                try:
                    data = await receive()
                finally:
                    self._waiting.discard(scope)
            if scope.cancelled_caught:
                return None
        boundary.feed(data)
        return data
