"""kasd, the server side of kasd/agentd: agents dial in, kubectl and CI jobs reach clusters through them.

Modules: ``config`` (file/env/flags → frozen config), ``tokens`` (hashing and constant-time matching of
secrets), ``agents`` (authenticating agentd tunnels), ``tunnels`` (the local registry of live agent
sessions), ``access`` (who may use which agent, as whom), ``k8sproxy`` (the Kubernetes API proxy on
8154), ``metrics`` and ``observability`` (8151), ``server`` (running it all, graceful shutdown),
``notify`` (sd_notify and the ready file).

May import: ``wire``, ``daemonkit``, the standard library, trio, h11, h2, attrs, yaml, prometheus_client,
hypercorn.
Never ``agentd`` or ``kubesim``.
"""
