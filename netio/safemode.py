"""The one switch that turns off every fast path leaning on a library's internals.

``KASD_SAFE_MODE=1`` in the environment (read here, once, at import; nowhere else) makes both
daemons use the libraries only through their public API:

- ``netio.fastio``: Trio's own ``SocketStream``/``SSLStream`` where a stream is made through
  ``fast_stream``/``tls_stream``, and a plain ``trio.lowlevel.checkpoint`` wherever a fast path
  would skip a schedule point (so even a ``FastSocketStream``/``FastTLSStream`` built directly
  yields on every call, as Trio's streams do);
- ``h2trio.lean``: h2's plain ``H2Connection`` and ``FrameBuffer``, and hyperframe's own
  ``DataFrame`` repr (no patch).

It exists for when an upgrade of trio, h2 or hyperframe breaks an assumption the fences' tests name,
or a fast path is suspected of a bug: the same code then runs the slower, library-blessed way.
Any value but empty and ``0`` turns it on.
"""

from __future__ import annotations

import os

__all__ = ["ENVIRONMENT_VARIABLE", "SAFE_MODE"]

ENVIRONMENT_VARIABLE = "KASD_SAFE_MODE"

#: True: every fast path that relies on a library internal is off.
SAFE_MODE: bool = os.environ.get(ENVIRONMENT_VARIABLE, "").strip() not in ("", "0")
