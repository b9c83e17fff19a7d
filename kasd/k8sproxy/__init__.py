"""The Kubernetes API proxy (port 8154): kubectl → kasd → a logical stream → agentd → the API server.

``server`` accepts connections (plain or TLS; HTTP/1.1 via h11, HTTP/2 via h2 by ALPN or h2c prior
knowledge) and bounds what a client may cost before it authenticates (header size and time, idle
keep-alive). ``http1``/``http2`` speak the protocols; ``forward`` is the part they share: token →
grant → request head → a session from the registry → the agent's response head. ``status`` builds
Kubernetes ``Status`` errors; ``accesslog`` writes one line per request.
"""

from kasd.k8sproxy.server import ProxyServer

__all__ = ["ProxyServer"]
