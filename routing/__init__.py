"""How a request reaches its agent, on one kasd or many: the local tunnel registry and router
(``local``), the typed failures (``errors``) and, for replicas, the consistent-hash ring, membership,
the Redis tunnel registry and the kasd-to-kasd hop.

Depends on ``wire`` and the support packages (``daemonkit``, ``netio``, ``tunnelhttp``); never on
``kasd`` or ``agentd``.
"""
