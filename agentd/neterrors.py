"""Why a connection failed, in words a person can act on.

``Connection refused``, ``cannot resolve kube-api.internal (Name or service not known)``, ``TLS error:
[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate``: what an error
message and a log line say after ``cannot reach <url>:``. Never a traceback, an address tuple or
OpenSSL's source line; nothing here ever sees a token.
"""

from __future__ import annotations

import os
import re
import socket
import ssl

import trio

_OPENSSL_SOURCE_LINE = re.compile(r"\s*\(_ssl\.c:\d+\)$")


def failure_reason(exc: BaseException, *, host: str | None = None) -> str:
    """The cause of ``exc`` (a failed connect, handshake, send or receive); ``host`` is the name
    that was being resolved, for a resolution failure."""
    cause = exc.__cause__ or exc.__context__
    if type(exc) is trio.BrokenResourceError and cause is not None:
        return failure_reason(cause, host=host)  # trio's wrapper around the OSError or SSLError
    if isinstance(exc, socket.gaierror):
        detail = exc.strerror or str(exc)
        return f"cannot resolve {host} ({detail})" if host else f"name resolution failed ({detail})"
    if isinstance(exc, ssl.SSLError):
        # "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get local issuer
        # certificate": OpenSSL's code (to search for) and its words; not the line of _ssl.c
        return f"TLS error: {_OPENSSL_SOURCE_LINE.sub('', str(exc)) or exc.reason}"
    if isinstance(exc, OSError) and isinstance(cause, BaseExceptionGroup):
        # trio's "all attempts to connect to host:port failed": the attempts say why
        reasons = dict.fromkeys(failure_reason(inner, host=host) for inner in cause.exceptions)
        return "; ".join(reasons)
    if isinstance(exc, OSError) and exc.errno is not None and exc.errno > 0:
        return os.strerror(exc.errno)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc) or type(exc).__name__
    if isinstance(cause, OSError) and not isinstance(cause, ssl.SSLError) and cause.errno:
        text += f" ({os.strerror(cause.errno)})"
    return text
