"""kasd, the server side of kasd/agentd: agents dial in, kubectl and CI jobs reach clusters through them.

Modules: ``config`` (file/env/flags → frozen config), ``tokens`` (hashing and constant-time matching of
secrets), ``agents`` (authenticating agentd tunnels), ``seams`` (the ``Authority`` and ``Router``
protocols the proxy's pipeline is given), ``access`` (the static ``access:`` list: the first
Authority), ``tunnels`` (the local registry of live agent sessions and ``LocalRouter``, the first
Router), ``k8sproxy`` (the Kubernetes API proxy on 8154: protocol front ends feeding one request
pipeline), ``metrics`` and ``observability`` (8151), ``store`` (what must outlive a process: finished
jobs, in SQLite alone or Redis among replicas), ``server`` (running it all, graceful shutdown).

May import: ``wire``, ``tunnelhttp``, ``http11``, ``netio``, ``daemonkit``, the standard library,
trio, h2, attrs, yaml, prometheus_client.
Never ``agentd`` or ``kubesim``.
"""
