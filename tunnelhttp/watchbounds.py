"""Where an endless Kubernetes response may be cut without splitting an event.

A watch or a followed log never ends by itself, so a daemon that shuts down must end it. The API
server's own answer is to end the response cleanly between two events: clients (informers, ``kubectl
get -w``) then see a closed watch and watch again, where a cut in mid-event would leave them a
truncated object, and a reset a stream error. This module only tracks the boundaries; the daemons
decide when to cut (``tunnelhttp.drain``).

- JSON watch streams (``application/json``, also Table) are one object per line, newline-ended.
- Protobuf watch streams (``application/vnd.kubernetes.protobuf;stream=watch``) are frames with a
  4-byte big-endian length prefix.
- Followed logs are text: a line end is the polite place to stop.
"""

from __future__ import annotations

from urllib.parse import parse_qsl

__all__ = ["EventBoundary", "is_endless"]

_ENDLESS_FLAGS = ("watch", "follow")
_TRUE = ("1", "true")


def is_endless(target: str) -> bool:
    """Whether a request target asks for a response that only ends when someone ends it."""
    path, _, query = target.partition("?")
    if "/watch/" in path:
        return True  # the deprecated /api/v1/watch/... form
    return any(key in _ENDLESS_FLAGS and value.lower() in _TRUE for key, value in parse_qsl(query))


class EventBoundary:
    """Feed it the body bytes as they pass; ``at_boundary`` says whether a cut now splits nothing."""

    def __init__(self, content_type: str) -> None:
        self._framed = "protobuf" in content_type.lower()
        self._header_left = 4  # framed: length-prefix bytes still to come for the current frame
        self._header = 0
        self._payload_left = 0
        self._line_open = False  # text: bytes since the last newline

    @classmethod
    def for_response(cls, target: str, content_type: str | None) -> EventBoundary | None:
        """A tracker for an endless response; None for one that ends by itself."""
        return cls(content_type or "") if is_endless(target) else None

    @property
    def at_boundary(self) -> bool:
        if self._framed:
            return self._header_left == 4 and self._payload_left == 0
        return not self._line_open

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._framed:
            self._line_open = data[-1] != 0x0A
            return
        view = memoryview(data).cast("B")
        while view:
            if self._payload_left:
                step = min(self._payload_left, len(view))
                self._payload_left -= step
                view = view[step:]
                continue
            self._header = (self._header << 8) | view[0]
            self._header_left -= 1
            view = view[1:]
            if self._header_left == 0:
                self._payload_left = self._header
                self._header_left, self._header = 4, 0
