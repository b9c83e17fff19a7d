"""What the proxy's listener gives each protocol front end: the limits a connection lives under,
the drain state, where rejected requests are counted, and where exchanges go.

``server`` builds one ``FrontEndContext`` per port; ``http1``/``http2`` read it and never import
``server`` or the pipeline, so the import arrows point one way (server → front ends → this).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import attrs
import trio

from daemonkit.logs import UnexpectedErrors
from h2trio.budget import ResetBucket, ResetBuckets, ResetLimit
from kasd.k8sproxy.accesslog import RequestRecord
from kasd.k8sproxy.exchange import Exchange
from kasd.k8sproxy.status import ProxyError
from netio.admission import source_of
from netio.fastio import peer_host


class ConnectionLimits(Protocol):
    """The bounds of one connection (``kasd.config.KubernetesAPIListener`` has them)."""

    @property
    def max_header_bytes(self) -> int: ...
    @property
    def header_timeout(self) -> float: ...
    @property
    def idle_timeout(self) -> float: ...
    @property
    def http2(self) -> Http2ClientLimits: ...


class Http2ClientLimits(Protocol):
    """What an HTTP/2 client may cost: the part of ``kasd.config.Http2Limits`` the front ends read
    (they never import the config)."""

    @property
    def reset_limit(self) -> ResetLimit: ...


class ServeExchange(Protocol):
    def __call__(
        self,
        ex: Exchange,
        *,
        refusal: ProxyError | None = None,
        log_dropped: bool = True,
        done: Callable[[RequestRecord], object] | None = None,
    ) -> Awaitable[None]: ...


@attrs.define(eq=False, kw_only=True)
class FrontEndContext:
    limits: ConnectionLimits
    #: answers one exchange (the request pipeline)
    serve: ServeExchange
    #: counts a request answered before it became an exchange (unparseable, too slow)
    count_rejected: Callable[[int], None]
    #: no new requests: idle connections close, busy ones after their current requests
    draining: bool = False
    #: cancel scopes of connections waiting idle for a request; cancelled when draining starts
    idle_scopes: set[trio.CancelScope] = attrs.field(factory=set)
    #: the HTTP/2 reset budget of each source address, shared by its connections (None: each
    #: connection has its own)
    reset_buckets: ResetBuckets | None = None
    #: where an exception nobody expected is reported (one rate-limited line): the request it hit
    #: ends, its connection's other requests go on
    unexpected: UnexpectedErrors = attrs.field(factory=lambda: UnexpectedErrors(logging.getLogger("kasd.k8sproxy")))

    def reset_bucket(self, peer: str) -> ResetBucket | None:
        """The reset budget of ``peer``'s (``host:port``) source, shared with its other connections."""
        if self.reset_buckets is None:
            return None
        return self.reset_buckets.bucket(source_of(peer_host(peer).strip("[]")), trio.current_time())
