"""What an HTTP exchange means on the tunnel: the request and response heads carried in a logical
stream's OPEN/ACCEPT metadata, impersonation, the application refusal codes (``head``), where a
watch or followed log may end (``watchbounds``, sans-I/O), and ending those at such a boundary when
a daemon drains (``drain``, Trio).

Both daemons speak it over ``wire``: kasd writes request heads, agentd answers them.
May import: ``tunnelhttp.kinds``, ``tunnelhttp.servicepath``, ``wire`` (frames, errors, and codec/settings for the limits of a head), the standard library, attrs, trio (``drain`` and ``dispatch`` only).
Never ``kasd``, ``agentd`` or ``kubesim``.
"""
