"""The Kubernetes API proxy (port 8154): kubectl → kasd → a logical stream → agentd → the API server.

``server`` accepts connections (plain or TLS; HTTP/1.1 via llhttp, HTTP/2 via h2 by ALPN or h2c
prior knowledge) and bounds what a client may cost before it authenticates (header size and time,
idle keep-alive). The front ends ``http1``/``http2`` speak only their protocol: each request becomes
an ``exchange.Exchange``. ``pipeline`` is the one place a request is decided: authenticate →
authorize (``kasd.seams.Authority``) → route (``kasd.seams.Router``) → relay → record. ``status``
builds Kubernetes ``Status`` errors; ``accesslog`` writes one line per request.

Arrows: server → front ends → exchange/frontend; server → pipeline → seams, exchange. The front
ends never import the pipeline, a seam, ``wire`` or ``tunnelhttp``.
"""

from kasd.k8sproxy.server import ProxyServer

__all__ = ["ProxyServer"]
