"""The tunnel wire protocol: a sans-I/O msgpack frame codec and stream multiplexer.

The core (``errors``, ``frames``, ``codec``, ``events``, ``settings``, ``streamstate``, ``flow``,
``mux``) imports neither trio nor h2 and never reads a clock: bytes in, events out, bytes to send.
``ids`` is the one strict parser of the numbers clients and files write as text (agent, project and
job ids, ports), here so that kasd, agentd, kasctl and ``routing`` all share it.
The adapters beside it (``session`` over any ``trio.abc.Stream``, ``h2carrier`` carrying a session on
one HTTP/2 stream, driven by ``h2trio``) are thin; ``carrier`` is what every carrier shares (the
authenticate callback, the request checks, ``TunnelRejectedError``), sans-I/O; ``receptive`` the
hello that comes first on a connection kasd dials to a receptive agentd (and its JWT), sans-I/O. ``errors`` holds the
project's one ``ProtocolError`` family. What an HTTP exchange means on a stream lives in
``tunnelhttp``; the byte streams underneath in ``netio``.

May import: ``netio``, ``h2trio``, the standard library, attrs, msgpack, trio and h2 (adapters only),
``daemonkit.logs`` (the adapters' lines a stranger can repeat), and joserfc and cryptography
(``receptive``'s JWT and Ed25519 keys).
Never ``tunnelhttp``, ``routing``, ``kasd``, ``agentd`` or ``kubesim``.
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
