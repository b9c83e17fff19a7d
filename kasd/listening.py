"""kasd's listening sockets: which listeners run, their TLS contexts, binding them, and the caps every
connection passes at accept.

    names = listener_names(config, replicated=False)
    bound = await bind_listeners(config, names)          # an OSError naming the listener if one fails
    admissions = {name: listener_admission(name, …) for name in names}

May import: ``kasd.config``, ``kasd.metrics``, ``daemonkit``, ``netio.admission``, ``netio.tlsreload``, ``h2trio.budget``,
trio and the standard library; never a server or a pipeline.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any

import attrs
import trio

from daemonkit.listeners import capped_admission
from daemonkit.logs import BurstLimitedLog
from h2trio.budget import ResetBuckets
from kasd.config import Config, ConfigError, Listener, check_plaintext, plaintext_listeners
from kasd.metrics import Metrics
from netio.admission import PER_SOURCE, TOTAL, Admission, CappedListener, ConnectionCaps, Refusal
from netio.tlsreload import ReloadingContext, TLSFiles, TLSLoadError

_log = logging.getLogger("kasd")

#: the refusal reason (and metric label) of a source that spent its HTTP/2 reset budget
RESET_BUDGET = "reset_budget"


def listener_names(config: Config, *, replicated: bool) -> tuple[str, ...]:
    """The listeners this kasd runs (the order of the ready file and the metrics): the private one
    among replicas only, the REST API's only with an address."""
    return ("agent", "observability", "kubernetes_api", *(("private",) if replicated else ()),
            *(("api",) if config.listeners.api.address is not None else ()))


#: the order listeners are bound in (the first that cannot be is the one an error names)
_BIND_ORDER = ("agent", "kubernetes_api", "observability", "private", "api")


def listener_ssl_context(listener: Listener, name: str) -> ssl.SSLContext | None:
    """The server TLS context of ``listeners.<name>`` (None: plain), read again from its files when
    they change (``netio.tlsreload``)."""
    if listener.tls is None:
        return None
    files = TLSFiles(server=True, cert=listener.tls.cert, key=listener.tls.key)
    try:
        return ReloadingContext(files, name=f"listeners.{name}", check_interval=listener.tls.reload_interval)
    except TLSLoadError as exc:
        raise ConfigError(f"listeners.{name}.tls: {exc}") from None


def warn_plaintext(config: Config, names: tuple[str, ...]) -> None:
    """A ConfigError for a listener that would serve plain text beyond loopback unasked; one WARNING
    at start for each one that does (its insecure_plaintext, or the observability port without its optional TLS)."""
    check_plaintext(config, names)
    for name, address in plaintext_listeners(config, names):
        if name == "observability":
            _log.warning("the observability listener serves health and metrics in plain text beyond loopback "
                         "address=%s; keep it on a network you trust, or set listeners.observability.tls", address)
        else:
            _log.warning("the %s listener serves plain text beyond loopback: listeners.%s.insecure_plaintext is true; "
                         "whoever is on the network reads and alters what crosses it, tokens included address=%s",
                         name, name, address)


@attrs.frozen(kw_only=True)
class Bound:
    """Every listener's sockets, bound and listening, by name."""

    sockets: dict[str, list[trio.SocketListener]]

    @property
    def addresses(self) -> dict[str, str]:
        """name → the ``host:port`` it is bound to (``[v6]:port``)."""
        return {name: _bound(sockets) for name, sockets in self.sockets.items()}


async def bind_listeners(config: Config, names: tuple[str, ...]) -> Bound:
    """Bind each named listener; an ``OSError`` naming the listener and its address if one cannot."""
    sockets: dict[str, list[trio.SocketListener]] = {}
    for name in sorted(names, key=_BIND_ORDER.index):
        listener: Listener = getattr(config.listeners, name)
        try:
            sockets[name] = await trio.open_tcp_listeners(listener.port, host=listener.host)
        except OSError as exc:
            message = f"cannot listen on {listener.address} (the {name} listener): {exc.strerror or exc}"
            raise OSError(exc.errno, message) from None
    return Bound(sockets={name: sockets[name] for name in names})


def _bound(listeners: list[trio.SocketListener]) -> str:
    host, port = listeners[0].socket.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listener_admission(name: str, listener: Listener, metrics: Metrics, refusals: BurstLimitedLog,
                       reset_buckets: ResetBuckets | None = None) -> Admission:
    """The connection caps of one listener, each refusal counted in the metrics and (a few lines
    under a flood) in the log; with ``reset_buckets``, a source that spent its HTTP/2 reset budget
    is turned away at accept until it refills."""
    caps = ConnectionCaps(
        max_connections=listener.max_connections,
        max_per_source=min(listener.max_connections_per_source, listener.max_connections),
    )
    reasons = (TOTAL, PER_SOURCE, RESET_BUDGET) if reset_buckets is not None else (TOTAL, PER_SOURCE)
    counters = {reason: metrics.connections_refused.labels(listener=name, reason=reason) for reason in reasons}
    gate = None
    if reset_buckets is not None:
        buckets = reset_buckets

        def gate(source: str) -> str | None:
            return RESET_BUDGET if buckets.barred(source, trio.current_time()) else None

    def count(refusal: Refusal) -> None:
        counters[refusal.reason].inc()

    admission = capped_admission(caps, listener=name, log=refusals, count=count, gate=gate)

    def open_connections() -> int:
        return admission.statistics().connections

    metrics.listener_connections.labels(listener=name).set_function(open_connections)
    return admission


class StoppableListener(trio.abc.Listener[trio.abc.Stream]):
    """Stops accepting (and closes the socket) once ``stop`` is set, without failing ``serve_listeners``."""

    def __init__(self, inner: CappedListener, stop: trio.Event) -> None:
        self.inner = inner
        self.stop = stop

    @property
    def socket(self) -> Any:
        return self.inner.socket

    async def accept(self) -> trio.abc.Stream:
        async with trio.open_nursery() as nursery:
            accepted: list[trio.abc.Stream] = []

            async def accept_one() -> None:
                accepted.append(await self.inner.accept())
                nursery.cancel_scope.cancel()

            async def wait_stop() -> None:
                await self.stop.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(accept_one)
            nursery.start_soon(wait_stop)
        if accepted:
            return accepted[0]
        await self.inner.aclose()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        await self.inner.aclose()


__all__ = ["RESET_BUDGET", "Bound", "StoppableListener", "bind_listeners", "listener_admission", "listener_names",
           "listener_ssl_context", "warn_plaintext"]
