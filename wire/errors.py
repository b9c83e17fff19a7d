"""The project's one ``ProtocolError`` family, and the tunnel's error codes.

Whose fault it was decides the type, as in h11: ``LocalProtocolError`` (this side misused an API;
nothing was sent) or ``RemoteProtocolError`` (the peer broke the protocol). Each carries hints of
what to send back: ``code`` for a tunnel frame (RESET, REFUSE, GOAWAY), ``status`` for an HTTP
answer. The tunnel core (``wire``), its HTTP meaning (``tunnelhttp``) and the HTTP/1.1 framing of the
outer hops (``http11``) all raise these; ``http11.ProtocolError`` is this very base class.

Why here: this module is a leaf of the sans-I/O core (standard library only; ``wire/__init__`` adds
attrs, never trio or h2), so every package may import it without pulling in I/O, and no second
family is needed for the packages that must not import trio (``http11``). The arrows point one way:
``http11`` → ``wire.errors``, never ``wire`` → ``http11``.
"""

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
    """Base of the family: catch this for "any protocol was broken".

    ``code`` is what goes on a tunnel frame; ``status`` is what an HTTP server answers (given only by
    HTTP framing, which then reads as its message alone, as HTTP error texts always have).
    """

    def __init__(
        self, message: str, code: ErrorCode = ErrorCode.PROTOCOL_ERROR, *, status: int | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status

    def __str__(self) -> str:
        if self.status is not None:
            return self.message
        return f"{self.message} ({self.code.name})"


class LocalProtocolError(ProtocolError):
    """This side misused the API (sent on a closed stream, exceeded a window, …). Nothing was sent."""


class UnsendableFrameError(LocalProtocolError):
    """A frame carrying the caller's data (its OPEN or ACCEPT metadata) cannot be sent as it is: over
    the limits the peer's decoder enforces, or not encodable. A verdict on that data, not on the
    connection, which goes on unharmed: trying it on another connection gets the same answer."""


class RemoteProtocolError(ProtocolError):
    """The peer broke the protocol. The session is dead; a GOAWAY carrying ``code`` is queued."""
