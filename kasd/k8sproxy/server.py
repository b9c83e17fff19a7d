"""Accepting proxy connections: TLS (ALPN h2/http1.1) or plain (HTTP/1.1, or h2c prior knowledge),
the bounds every connection lives under, and the graceful drain. Each connection goes to its
protocol front end (``http1``, ``http2``), whose exchanges go to the one request pipeline."""

from __future__ import annotations

import logging
import ssl

import trio

from daemonkit.logs import BurstLimitedLog
from h2trio.budget import ResetBuckets
from kasd.config import KubernetesAPIListener
from kasd.k8sproxy.exchange import CONNECTION_LOST
from kasd.k8sproxy.frontend import FrontEndContext
from kasd.k8sproxy.http1 import Http1Connection
from kasd.k8sproxy.http2 import Http2Connection
from kasd.k8sproxy.pipeline import RequestPipeline
from kasd.metrics import Metrics
from netio.fastio import fast_stream, peer_host, peer_name, tls_stream

log = logging.getLogger("kasd.k8sproxy")
#: lines a stranger can repeat once per connection: at most one per 10 s per source and kind
_strangers = BurstLimitedLog(log, interval=10.0)

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#: how long a closing TLS connection may take to send its close_notify (a client not reading)
_TLS_CLOSE_SECONDS = 1.0


def configure_alpn(ctx: ssl.SSLContext) -> ssl.SSLContext:
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    return ctx


class ProxyServer:
    """Serves connections handed to ``handle_connection`` (e.g. by ``trio.serve_listeners``)."""

    def __init__(
        self,
        pipeline: RequestPipeline,
        metrics: Metrics,
        settings: KubernetesAPIListener,
        *,
        ssl_context: ssl.SSLContext | None = None,
        reset_buckets: ResetBuckets | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.metrics = metrics
        self.settings = settings
        self.ssl_context = ssl_context
        self.port = FrontEndContext(
            limits=settings,
            serve=pipeline.serve,
            count_rejected=self.count_rejected,
            reset_buckets=reset_buckets if reset_buckets is not None else ResetBuckets(settings.http2.reset_limit),
            unexpected=pipeline.unexpected,
        )
        self.connections = 0
        self._no_connections = trio.Event()
        self._no_connections.set()

    # ------------------------------------------------------------------ lifetime

    @property
    def draining(self) -> bool:
        return self.port.draining

    def start_drain(self) -> None:
        """Stop taking requests: idle connections close now, busy ones after their current requests."""
        self.port.draining = True
        self.pipeline.drain.begin()
        for scope in list(self.port.idle_scopes):
            scope.cancel()

    async def wait_closed(self) -> None:
        """Return once no connection is left (bound it with a cancel scope)."""
        await self._no_connections.wait()

    def count_rejected(self, status: int) -> None:
        self.metrics.count_request(status)
        self.metrics.count_proxied(status, None, None)

    # ------------------------------------------------------------------ one connection

    async def handle_connection(self, stream: trio.abc.Stream) -> None:
        self.connections += 1
        self._no_connections = trio.Event() if self.connections == 1 else self._no_connections
        self.metrics.proxy_connections.inc()
        stream = fast_stream(stream)
        peer = peer_name(stream)
        try:
            await self._serve(stream, peer)
        except CONNECTION_LOST as exc:
            log.debug("proxy connection ended peer=%s error=%r", peer, exc)
        except Exception as exc:  # one bad connection must never take the listener down
            self.port.unexpected.report(exc, "proxy connection failed unexpectedly peer=%s", peer)
        finally:
            with trio.move_on_after(1, shield=True):
                await stream.aclose()
            self.metrics.proxy_connections.dec()
            self.connections -= 1
            if self.connections == 0:
                self._no_connections.set()

    async def _serve(self, stream: trio.abc.Stream, peer: str) -> None:
        head_deadline = trio.current_time() + self.settings.header_timeout
        initial = b""
        use_h2 = False
        with trio.CancelScope(deadline=head_deadline) as scope:
            if self.ssl_context is not None:
                tls = tls_stream(stream, self.ssl_context, server_side=True)
                try:
                    await tls.do_handshake()
                except trio.BrokenResourceError as exc:
                    _strangers.info(
                        (peer_host(peer), "tls"), "TLS handshake failed peer=%s error=%s", peer, exc.__cause__ or exc
                    )
                    return
                stream = tls
                use_h2 = tls.selected_alpn_protocol() == "h2"
            else:
                # Plain text: HTTP/1.1, unless the client starts with the HTTP/2 preface (h2c).
                while len(initial) < len(H2_PREFACE) and H2_PREFACE.startswith(initial):
                    data = await stream.receive_some(64 * 1024)
                    if not data:
                        break
                    initial += data
                use_h2 = initial.startswith(H2_PREFACE)
        if scope.cancelled_caught and (self.ssl_context is not None or not initial):
            # Nothing (or no TLS handshake) within the head timeout: just close.
            _strangers.info((peer_host(peer), "silent"), "client sent nothing in time peer=%s", peer)
            self.count_rejected(408)
            return
        # A partial plain-text head that timed out falls through: HTTP/1.1 answers it 408.
        try:
            if use_h2:
                await Http2Connection(stream, self.port, initial=initial, head_deadline=head_deadline, peer=peer).run()
            else:
                await Http1Connection(stream, self.port, initial=initial, head_deadline=head_deadline, peer=peer).run()
        finally:
            if self.ssl_context is not None:
                # TLS's own end (close_notify), so the client reads a clean EOF, not a truncation
                with trio.move_on_after(_TLS_CLOSE_SECONDS, shield=True):
                    await stream.aclose()

