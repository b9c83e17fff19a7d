"""HTTP/2 over Trio, for both daemons: the one driver of an ``h2`` connection over a Trio stream
(``driver``), what a peer may cost it, checked in front of h2 (``budget``: frame sizes, header
blocks, streams reset), and the fence around the h2/hyperframe internals its fast paths use (``lean``).

Not the tunnel protocol: ``wire.h2carrier`` (a session over one HTTP/2 stream) and kasd's HTTP/2
proxy front end build on this package.
May import: the standard library, trio, h2, hyperframe, ``netio``. Never ``wire``, ``http11``,
``tunnelhttp``, ``kasd``, ``agentd`` or ``kubesim``.
"""
