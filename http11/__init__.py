"""HTTP/1.1 framing over llhttp (httptools), sans-I/O: what kasd's proxy port and agentd's upstream
hop both speak. Bytes in, events out; heads and chunked bodies encoded for sending.

May import: the standard library, attrs, httptools. Never trio, ``wire``, ``kasd`` or ``agentd``.
"""

from http11.framing import (
    CLOSED,
    END,
    NEED_DATA,
    BodyWriter,
    FramingError,
    ProtocolError,
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
    "Request",
    "RequestParser",
    "Response",
    "ResponseParser",
    "encode_request_head",
    "encode_response_head",
]
