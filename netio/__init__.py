"""Byte streams for both daemons: lean TCP and TLS streams that yield to Trio only when they wait
(``fastio``, the fence around that bet) and the helpers around them (peer names, vectored sends,
cancel points); the one byte relay after ``101`` (``relay``); the one switch that turns every fast
path leaning on a library's internals off (``safemode``, ``KASD_SAFE_MODE``).

Not the tunnel protocol: ``wire`` builds on this package, never the reverse.
May import: the standard library, attrs and trio. Never ``wire``, ``kasd``, ``agentd`` or ``kubesim``.
"""
