"""Frames: one frozen value class per kind. Their wire form is a msgpack array ``[kind, ...fields]``.

Metadata (HELLO, OPEN, ACCEPT) is a msgpack map with string keys whose values are nil, bool, int,
float, str, bin, arrays or maps of those — typed, structured data, never an opaque blob.
"""

from __future__ import annotations

import enum
from typing import Any, TypeAlias

import attrs

from wire.errors import ErrorCode

Metadata: TypeAlias = dict[str, Any]


class FrameKind(enum.IntEnum):
    HELLO = 0
    OPEN = 1
    ACCEPT = 2
    REFUSE = 3
    DATA = 4
    WINDOW_UPDATE = 5
    HALF_CLOSE = 6
    RESET = 7
    PING = 8
    PONG = 9
    GOAWAY = 10
    #: since protocol 1.1: a one-way control message (kasd → agentd: where to connect)
    NOTICE = 11


@attrs.frozen(kw_only=True)
class Hello:
    """First frame each side sends: protocol version, settings, and who this side is."""

    kind = FrameKind.HELLO
    major: int
    minor: int
    settings: dict[str, Any]
    metadata: Metadata = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class Open:
    """Opens a stream; the metadata is typed request data (for kasd: the HTTP request head)."""

    kind = FrameKind.OPEN
    stream_id: int
    metadata: Metadata = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class Accept:
    kind = FrameKind.ACCEPT
    stream_id: int
    metadata: Metadata = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class Refuse:
    kind = FrameKind.REFUSE
    stream_id: int
    code: int
    message: str = ""


@attrs.frozen(kw_only=True)
class Data:
    kind = FrameKind.DATA
    stream_id: int
    payload: bytes


@attrs.frozen(kw_only=True)
class WindowUpdate:
    kind = FrameKind.WINDOW_UPDATE
    stream_id: int
    increment: int


@attrs.frozen(kw_only=True)
class HalfClose:
    """The sender will send no more DATA on this stream (FIN)."""

    kind = FrameKind.HALF_CLOSE
    stream_id: int


@attrs.frozen(kw_only=True)
class Reset:
    """Abort a stream. After the receiver saw HALF_CLOSE it only means "stop sending"."""

    kind = FrameKind.RESET
    stream_id: int
    code: int
    message: str = ""


@attrs.frozen(kw_only=True)
class Ping:
    kind = FrameKind.PING
    opaque: int


@attrs.frozen(kw_only=True)
class Pong:
    kind = FrameKind.PONG
    opaque: int


@attrs.frozen(kw_only=True)
class GoAway:
    """No new streams. Streams the peer opened with ids above ``last_stream_id`` were not processed."""

    kind = FrameKind.GOAWAY
    last_stream_id: int
    code: int = ErrorCode.NO_ERROR
    message: str = ""


@attrs.frozen(kw_only=True)
class Notice:
    """A one-way control message about the session as a whole (protocol 1.1). Its metadata has a
    ``type``; a receiver ignores types it does not know. Sent only to a peer whose HELLO said 1.1+."""

    kind = FrameKind.NOTICE
    metadata: Metadata = attrs.field(factory=dict)


Frame: TypeAlias = (
    Hello | Open | Accept | Refuse | Data | WindowUpdate | HalfClose | Reset | Ping | Pong | GoAway | Notice
)
