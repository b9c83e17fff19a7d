"""kasd, the server side of kasd/agentd: agents dial in, kubectl and CI jobs reach clusters through them.

Modules: ``config/`` (file/env/flags → frozen config, one module per concern), ``tokens`` (hashing
and constant-time matching of secrets), ``agents`` (authenticating agentd tunnels and registering
them), ``seams`` (the three protocols the proxy's pipeline is given: ``Authority``, ``Router`` and
``Provisioner``, with the values and failures they answer with), ``authority`` (``CiAuthority``, the
Authority: CI job and personal tokens over the pure ``authz/``), ``agentstream`` (a request's stream
to the agent, from open to response head, shared by the pipeline and ``managed/``), ``managed/``
(managed namespaces: ``AgentProvisioner``, the Provisioner), ``k8sproxy/`` (the Kubernetes API
proxy on 8154: protocol front ends feeding one request pipeline), ``restapi``, ``asgiport`` and
``restpaths`` (the REST API on 8153), ``replicas`` (replication among kasds), ``store/`` (what must
outlive a process: finished jobs, environments, what kasd made, in SQLite alone or Redis among
replicas), ``metrics`` and ``observability`` (8151), ``listening`` (the listeners and their caps),
``drain`` (the graceful drain), ``server`` (running it all). The Routers are ``routing``'s:
``LocalRouter``, and ``ReplicatedRouter`` among replicas. docs/architecture.md is the map.

May import: ``routing``, ``wire``, ``tunnelhttp``, ``http11``, ``h2trio``, ``netio``, ``daemonkit``,
the standard library, trio, h2, attrs, yaml, prometheus_client, coredis (``store``), joserfc,
cryptography and google-re2 (``authz``).
Never ``agentd`` or ``kubesim``.
"""
