"""kasctl: the command-line companion of kasd — the all-in-one demo stack, and the keys and tokens
kasd's Kubernetes API proxy accepts.

``kasctl.stack`` starts kubesim, kasd and agentd as real processes on loopback with throwaway
tokens and certificates (the demo and the end-to-end tests share it); ``kasctl.tokens`` makes the
Ed25519 signing key pair and mints CI job and personal tokens; ``kasctl.__main__`` is the CLI.
May import: stdlib, yaml, trustme (the ``demo`` extra, imported only when a stack is made),
``kasd.authz`` (signing and verifying tokens: no trio, no daemon), ``kasd.restpaths`` (the REST
API's paths: the standard library only), ``wire.ids`` (the one id check), ``daemonkit.completion``
(``kasctl completion``: the shell completion the daemons share). It talks to the daemons, and to
kubesim (a distribution of its own), only through their command lines — and to kasd's REST API
through ``kasctl.restclient`` (the one HTTP client that sends a token: it follows no redirect).
``kasctl proxy`` (trio, ``http11``, ``netio.relay``) checks each request with ``kasctl.proxyfilter``.
"""

from __future__ import annotations

from importlib import metadata as _metadata

try:
    #: what ``kasctl --version`` prints: the installed distribution's, as ``kasd --version`` and ``agentd --version``
    __version__ = _metadata.version("kasd")
except _metadata.PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0"

__all__ = ["__version__"]
