"""Byte streams for both daemons' hot paths: lean TCP and TLS streams that yield to Trio only when
they wait (``fastio``), and the helpers around them (peer names, vectored sends, cancel points).

Not the tunnel protocol: ``wire`` builds on this package, never the reverse.
May import: the standard library and trio. Never ``wire``, ``kasd``, ``agentd`` or ``kubesim``.
"""
