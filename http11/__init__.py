"""HTTP/1.1 framing over llhttp (httptools), sans-I/O: what kasd's proxy port and agentd's upstream
hop both speak. Bytes in, events out; heads and chunked bodies encoded for sending.

Errors are the project's one ``ProtocolError`` family from ``wire.errors`` (a sans-I/O leaf):
``ProtocolError`` here is that base class, and a malformed message raises its ``RemoteProtocolError``.

May import: the standard library, attrs, httptools, ``wire.errors``, ``wire.ids``. Never trio (nor anything that
imports it: the rest of ``wire``), ``kasd`` or ``agentd``.
"""

from http11.framing import (
    CLOSED,
    END,
    NEED_DATA,
    BodyWriter,
    FramingError,
    ProtocolError,
    RemoteProtocolError,
    Request,
    RequestParser,
    Response,
    ResponseParser,
    encode_request_head,
    encode_response_head,
)

__all__ = [
    "CLOSED",
    "END",
    "NEED_DATA",
    "BodyWriter",
    "FramingError",
    "ProtocolError",
    "RemoteProtocolError",
    "Request",
    "RequestParser",
    "Response",
    "ResponseParser",
    "encode_request_head",
    "encode_response_head",
]
