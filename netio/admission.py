"""How many connections one listener holds: at most ``max_connections`` at once, and at most
``max_per_source`` from one source, checked as each connection is accepted — before TLS, before a
byte is read or a task is started for it.

    admission = Admission(ConnectionCaps(max_connections=4096, max_per_source=512), on_refused=count)
    await trio.serve_listeners(handler, [admission.listener(s) for s in socket_listeners])

A connection over a cap is refused at once: closed with ``SO_LINGER`` 0, so the kernel answers with a
reset and keeps no state for it (no ``FIN_WAIT``/``TIME_WAIT`` per refused connection, and nothing is
read or written: a flood of them costs an ``accept`` and a ``close`` each). ``on_refused`` hears of
it (kasd counts it in a metric and writes a rate-limited log line).

An admitted connection holds its slot until its stream is closed: the handler must close the stream
it was given (every handler in kasd and agentd does, in a ``finally``). The per-source table holds
only sources with an open connection, so it is never larger than ``max_connections`` entries.

A source is an IPv4 address, or the /64 network of an IPv6 address (one host usually holds a whole
/64, so counting single IPv6 addresses would make the per-source cap free to evade); an IPv4-mapped
IPv6 address counts as its IPv4 address.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from collections.abc import Callable
from functools import partial

import attrs
import trio

from netio.fastio import FastSocketStream
from netio.safemode import SAFE_MODE

__all__ = [
    "PER_SOURCE",
    "TOTAL",
    "Admission",
    "AdmissionStatistics",
    "CappedListener",
    "ConnectionCaps",
    "Refusal",
    "source_of",
]

#: the reasons of a refusal: the listener is full, or the source has its share
TOTAL = "max_connections"
PER_SOURCE = "max_connections_per_source"

_IPV6_SOURCE_PREFIX = 64
_LINGER_RESET = struct.pack("ii", 1, 0)


@attrs.frozen(kw_only=True)
class ConnectionCaps:
    #: connections open at once on the listener
    max_connections: int
    #: connections open at once from one source (effectively at most ``max_connections``)
    max_per_source: int

    def __attrs_post_init__(self) -> None:
        if self.max_connections < 1 or self.max_per_source < 1:
            raise ValueError("connection caps must be at least 1")


@attrs.frozen(kw_only=True)
class Refusal:
    """One refused connection: why (``TOTAL`` or ``PER_SOURCE``), its source and its ``host:port``."""

    reason: str
    source: str
    peer: str
    #: the cap that was reached
    limit: int


@attrs.frozen(kw_only=True)
class AdmissionStatistics:
    #: connections open now
    connections: int
    #: sources with at least one open connection
    sources: int
    #: connections refused since the start
    refused: int


def source_of(host: str) -> str:
    """The source a peer address counts under (see the module docstring)."""
    try:
        address = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, _IPV6_SOURCE_PREFIX), strict=False))
    return str(address)


class Admission:
    """The open connections of one listener (all of its sockets), in total and per source."""

    def __init__(
        self,
        caps: ConnectionCaps,
        *,
        on_refused: Callable[[Refusal], None] | None = None,
        gate: Callable[[str], str | None] | None = None,
    ) -> None:
        self.caps = caps
        self.on_refused = on_refused
        #: a source turned away for now whatever its count (the reason), or None: e.g. one that
        #: spent its HTTP/2 reset budget, whose next connection would cost a TLS handshake for nothing
        self.gate = gate
        self._open = 0
        self._refused = 0
        self._by_source: dict[str, int] = {}
        self._changed: trio.Event | None = None  # made only while someone waits

    def statistics(self) -> AdmissionStatistics:
        return AdmissionStatistics(connections=self._open, sources=len(self._by_source), refused=self._refused)

    async def wait_changed(self) -> None:
        """Return once a connection was admitted, released or refused."""
        if self._changed is None:
            self._changed = trio.Event()
        await self._changed.wait()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def listener(self, inner: trio.SocketListener) -> CappedListener:
        return CappedListener(inner, self)

    def admit(self, source: str) -> str | None:
        """Take a slot for ``source`` (None), or say which cap is reached (``TOTAL``, ``PER_SOURCE``,
        or the gate's reason)."""
        if self.gate is not None and (barred := self.gate(source)) is not None:
            return barred
        if self._open >= self.caps.max_connections:
            return TOTAL
        held = self._by_source.get(source, 0)
        if held >= self.caps.max_per_source:
            return PER_SOURCE
        self._by_source[source] = held + 1
        self._open += 1
        self._notify()
        return None

    def release(self, source: str) -> None:
        self._open -= 1
        held = self._by_source[source] - 1
        if held:
            self._by_source[source] = held
        else:
            del self._by_source[source]  # forget a source with no connection
        self._notify()

    def refused(self, refusal: Refusal) -> None:
        self._refused += 1
        if self.on_refused is not None:
            self.on_refused(refusal)
        self._notify()

    def limit(self, reason: str) -> int:
        """The cap behind a refusal's ``reason`` (0 for the gate's)."""
        if reason == TOTAL:
            return self.caps.max_connections
        return self.caps.max_per_source if reason == PER_SOURCE else 0


class CappedListener(trio.abc.Listener[trio.abc.Stream]):
    """A socket listener whose ``accept`` returns only connections its ``Admission`` takes; it
    refuses the others itself (see the module docstring) and goes on accepting."""

    def __init__(self, inner: trio.SocketListener, admission: Admission) -> None:
        self.inner = inner
        self.admission = admission

    @property
    def socket(self) -> trio.socket.SocketType:
        return self.inner.socket

    async def accept(self) -> trio.abc.Stream:
        admission = self.admission
        while True:
            stream = await self.inner.accept()
            sock = stream.socket
            try:
                host, port = sock.getpeername()[:2]
            except OSError:  # reset before we got to it: nothing to serve, nothing to count
                sock.close()
                continue
            source = source_of(host)
            reason = admission.admit(source)
            if reason is None:
                return _tracked(stream, partial(admission.release, source))
            _refuse(sock)
            admission.refused(Refusal(reason=reason, source=source, peer=f"{host}:{port}", limit=admission.limit(reason)))

    async def aclose(self) -> None:
        await self.inner.aclose()


def _refuse(sock: trio.socket.SocketType) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    except OSError:
        pass  # closed politely then
    sock.close()


def _tracked(stream: trio.SocketStream, release: Callable[[], None]) -> trio.abc.Stream:
    """``stream`` as the handler gets it, calling ``release`` once when it is closed."""
    if SAFE_MODE:
        return _ReleasingStream(stream, release)
    fast = FastSocketStream.from_trio(stream)
    fast.on_close = release
    return fast


class _ReleasingStream(trio.abc.HalfCloseableStream):
    """Trio's own ``SocketStream`` (``KASD_SAFE_MODE``), calling ``release`` once when closed."""

    def __init__(self, inner: trio.SocketStream, release: Callable[[], None]) -> None:
        self.inner = inner
        self._release: Callable[[], None] | None = release

    @property
    def socket(self) -> trio.socket.SocketType:
        return self.inner.socket

    def setsockopt(self, level: int, option: int, value: int | bytes) -> None:
        self.inner.setsockopt(level, option, value)

    def getsockopt(self, level: int, option: int) -> int:
        return self.inner.getsockopt(level, option)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        return bytes(await self.inner.receive_some(max_bytes))

    async def aclose(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            self.inner.socket.close()  # now, before any checkpoint: a cancelled aclose still frees the slot
            release()
        await self.inner.aclose()
