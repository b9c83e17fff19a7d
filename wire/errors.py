"""Error codes and the two protocol error types: whose fault it was decides which one is raised."""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    """Codes carried by RESET, REFUSE and GOAWAY frames.

    0x000–0x0FF belong to the protocol; 0x100 and up are free for applications (kasd and agentd put
    their own reasons there, e.g. "cluster API unreachable").
    """

    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    STREAM_CLOSED = 0x4
    FRAME_SIZE_ERROR = 0x5
    REFUSED_STREAM = 0x6
    CANCEL = 0x7
    UNSUPPORTED_VERSION = 0x8
    KEEPALIVE_TIMEOUT = 0x9
    LIMIT_EXCEEDED = 0xA

    @classmethod
    def describe(cls, code: int) -> str:
        try:
            return cls(code).name
        except ValueError:
            return f"APPLICATION_ERROR_0x{code:x}" if code >= 0x100 else f"UNKNOWN_0x{code:x}"


class ProtocolError(Exception):
    """Base of both protocol errors; ``code`` is what goes on the wire."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.message = message
        self.code = code

    def __str__(self) -> str:
        return f"{self.message} ({self.code.name})"


class LocalProtocolError(ProtocolError):
    """This side misused the API (sent on a closed stream, exceeded a window, …). Nothing was sent."""


class RemoteProtocolError(ProtocolError):
    """The peer broke the protocol. The session is dead; a GOAWAY carrying ``code`` is queued."""
