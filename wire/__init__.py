"""The tunnel wire protocol: a sans-I/O msgpack frame codec and stream multiplexer.

The core (``errors``, ``frames``, ``codec``, ``events``, ``settings``, ``streamstate``, ``flow``,
``mux``) imports neither trio nor h2 and never reads a clock: bytes in, events out, bytes to send.
The adapters beside it (``session`` over any ``trio.abc.Stream``, ``h2carrier`` carrying a session on
one HTTP/2 stream, ``fastio``'s socket and TLS streams that yield only when they wait) are thin. Nothing here imports ``routing``, ``kasd`` or ``agentd``.
"""

from wire.errors import ErrorCode, LocalProtocolError, ProtocolError, RemoteProtocolError
from wire.settings import PROTOCOL_VERSION, Limits, Settings

__all__ = [
    "PROTOCOL_VERSION",
    "ErrorCode",
    "Limits",
    "LocalProtocolError",
    "ProtocolError",
    "RemoteProtocolError",
    "Settings",
]
