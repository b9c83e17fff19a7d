"""How a request reaches its agent, on one kasd or many: the local tunnel registry and router
(``local``), the typed failures (``errors``), the retry policy (``retry``) and, for replicas, the
consistent-hash ring, membership, the Redis tunnel directory, the kasd-to-kasd hop, home placement
and the ``ReplicatedRouter`` over ``LocalRouter`` (``router``).

Depends on ``wire`` and the support packages (``daemonkit``, ``netio``, ``tunnelhttp``); never on
``kasd`` or ``agentd``.
"""
