"""agentd: the in-cluster agent. It dials out to kasd, keeps tunnel sessions up, and answers the
HTTP exchanges kasd opens on them by replaying each against the Kubernetes API server with the
agent's own credentials plus ``Impersonate-*`` headers.

Modules: ``config`` (file/env/flags → AgentdConfig), ``kubeapi`` (how to reach the API server),
``upstream`` (HTTP/1.1 client with a keep-alive pool), ``neterrors`` (why a connection failed, in
words), ``proxy`` (one logical stream → one upstream exchange), ``services`` (the allow-list of
in-cluster services and its path check, sans-I/O), ``serviceproxy`` (streams of kind ``service``
→ one exchange with an allowed service), ``connection`` (the tunnel manager:
dialing, placement, GOAWAY replacement), ``receptive`` (receptive mode: kasd dials in, its
handshake checked, the connection handed to a slot), ``receptivefiles`` (its key and TLS files, and
the check of its settings, below ``config`` and ``receptive``), ``redial`` (when a slot dials next: the reconnect
schedule, sans-I/O), ``health``
(``/liveness``, ``/readiness``), ``agent`` (run_agent wiring it together), ``__main__`` (the
``agentd`` console script).

May import: ``wire``, ``tunnelhttp``, ``http11``, ``netio``, ``daemonkit``, the standard library, trio,
attrs, yaml, joserfc and cryptography (``receptive``: kasd's public key). Never ``kasd``, ``routing`` or ``kubesim``.
"""

from __future__ import annotations

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("kasd")
except _metadata.PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0"

__all__ = ["__version__"]
