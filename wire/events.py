"""Events the mux core reports from received bytes: one small frozen class per fact."""

from __future__ import annotations

from typing import Any, TypeAlias

import attrs

from wire.frames import Metadata


@attrs.frozen(kw_only=True)
class HandshakeCompleted:
    version: tuple[int, int]
    peer_metadata: Metadata


@attrs.frozen(kw_only=True)
class StreamOpened:
    """The peer opened a stream; accept or refuse it."""

    stream_id: int
    metadata: Metadata


@attrs.frozen(kw_only=True)
class StreamAccepted:
    stream_id: int
    metadata: Metadata


@attrs.frozen(kw_only=True)
class StreamRefused:
    """The peer refused a stream this side opened (or never processed it before a GOAWAY)."""

    stream_id: int
    code: int
    message: str


@attrs.frozen(kw_only=True)
class DataReceived:
    stream_id: int
    data: bytes


@attrs.frozen(kw_only=True)
class StreamEnded:
    """The peer half-closed: no more data will arrive on this stream."""

    stream_id: int


@attrs.frozen(kw_only=True)
class StreamReset:
    """A stream was aborted. ``remote`` tells whether the peer did it or this side (a stream error)."""

    stream_id: int
    code: int
    message: str
    remote: bool


@attrs.frozen(kw_only=True)
class WindowUpdated:
    """More send credit on a stream: wake anything waiting to send there."""

    stream_id: int
    increment: int


@attrs.frozen(kw_only=True)
class PongReceived:
    opaque: int
    #: round-trip time when the ping was ours and timed, else None
    rtt: float | None


@attrs.frozen(kw_only=True)
class GoAwayReceived:
    last_stream_id: int
    code: int
    message: str


@attrs.frozen(kw_only=True)
class NoticeReceived:
    metadata: dict[str, Any]


Event: TypeAlias = (
    HandshakeCompleted
    | StreamOpened
    | StreamAccepted
    | StreamRefused
    | DataReceived
    | StreamEnded
    | StreamReset
    | WindowUpdated
    | PongReceived
    | GoAwayReceived
    | NoticeReceived
)
