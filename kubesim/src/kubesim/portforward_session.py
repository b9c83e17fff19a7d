"""One port-forward connection's Trio side: the kubelet's stream handler over a SPDY session.

The SPDY session driver hands each stream the client opens to `PortForwardSession.stream_opened`;
the session pairs them (`portforward.StreamPairing`), accepts or resets each, and for every complete
pair connects to the port in the pod (`netsim.Network.connect`) and copies bytes both ways, or
writes the kubelet's message on the error stream when nothing listens there (`forward_error`).
The same session serves both transports (plain SPDY, and SPDY inside kubectl's WebSocket): it
only sees streams.

What it needs of a stream is `PeerStream`, the part of the driver's stream API it uses.
`port_forward_pod` is the API server's check before any of it (the raw upgrade's and the
WebSocket tunnel's alike).
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import trio

from kubesim import errors, portforward
from kubesim.cluster import Cluster
from kubesim.netsim import CHUNK
from kubesim.paths import Target
from kubesim.spdy_session import SpdySession
from kubesim.store import Store
from kubesim.streaming import PodStreamRequest, SpdySubresource

log = logging.getLogger(__name__)

#: How long the client's direction may go on once the pod's side ended (containerd: 1 s).
LINGER_SECONDS = 1.0


class PeerStream(Protocol):
    """A stream the client opened, as the session uses it (what `spdy_session.SpdyStream` offers)."""

    stream_id: int
    headers: tuple[tuple[str, str], ...]

    async def reply(self) -> None:
        """SYN_REPLY: the stream is accepted."""

    async def reset(self) -> None:
        """RST_STREAM: the stream is refused (or dropped)."""

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """The next bytes the client sent; b"" once it half-closed (FIN) or reset the stream."""
        ...

    async def send_all(self, data: bytes) -> None: ...

    async def send_eof(self) -> None:
        """Our half-close (FIN)."""


def sandbox_id(pod: dict[str, Any]) -> str:
    """A stable stand-in for the pod sandbox id containerd would name (64 hex digits)."""
    return hashlib.sha256(f"sandbox/{pod['metadata'].get('uid', '')}".encode()).hexdigest()


def netns_path(pod: dict[str, Any]) -> str:
    """A stable stand-in for the pod's network namespace path (CNI names them cni-<uuid>)."""
    digest = hashlib.sha256(f"netns/{pod['metadata'].get('uid', '')}".encode()).digest()
    return f"/var/run/netns/cni-{uuid.UUID(bytes=digest[:16])}"


class PortForwardSession:
    """The streams of one port-forward connection to `pod`; connections run in `nursery`."""

    def __init__(self, ctl: Cluster, pod: dict[str, Any], nursery: trio.Nursery,
                 *, current: Callable[[], dict[str, Any] | None] | None = None,
                 pairing: portforward.StreamPairing | None = None) -> None:
        self._ctl = ctl
        self._pod = pod
        # The pod as it is now (None: gone); what listens depends on what runs at connect time.
        self._current = current or (lambda: pod)
        self._nursery = nursery
        self._pairing = pairing or portforward.StreamPairing()
        self._streams: dict[int, PeerStream] = {}
        self._connections: set[trio.CancelScope] = set()
        self._pod_gone = False
        self._timer_running = False

    def pod_gone(self) -> None:
        """The pod went away: its connections break, and new ones find no sandbox."""
        self._pod_gone = True
        for scope in self._connections:
            scope.cancel()

    async def stream_opened(self, stream: PeerStream) -> None:
        """The client opened `stream`: accept or refuse it; a complete pair starts forwarding."""
        events = self._pairing.stream_opened(stream.stream_id, stream.headers, trio.current_time())
        for event in events:
            if isinstance(event, portforward.StreamRefused):
                log.info("port-forward stream %d refused: %s", stream.stream_id, event.reason)
                await _quietly(stream.reset)
            elif isinstance(event, portforward.StreamAccepted):
                await _quietly(stream.reply)
                self._streams[stream.stream_id] = stream
            elif isinstance(event, portforward.PairError):
                self._nursery.start_soon(self._write_error, event.error_stream, event.message, False)
            else:
                error = self._streams.pop(event.error_stream)
                data = self._streams.pop(event.data_stream)
                self._nursery.start_soon(self._forward, event.port, error, data)
        if self._pairing.pending and not self._timer_running:
            self._timer_running = True
            self._nursery.start_soon(self._expire_pending)

    async def _expire_pending(self) -> None:
        """Time out incomplete pairs (the kubelet's stream creation timeout)."""
        try:
            while (deadline := self._pairing.next_deadline()) is not None:
                await trio.sleep_until(deadline)
                for event in self._pairing.expire(trio.current_time()):
                    if isinstance(event, portforward.PairError):
                        await self._write_error(event.error_stream, event.message, True)
                    else:
                        stream = self._streams.pop(event.stream_id, None)
                        if stream is not None:
                            await _quietly(stream.reset)
        finally:
            self._timer_running = False

    async def _write_error(self, stream_id: int, message: str, close: bool) -> None:
        stream = self._streams.pop(stream_id, None) if close else self._streams.get(stream_id)
        if stream is None:
            return
        await _quietly(stream.send_all, message.encode())
        if close:
            await _quietly(stream.send_eof)

    async def _forward(self, port: int, error: PeerStream, data: PeerStream) -> None:
        """One forwarded connection: the pod's port ⇄ the data stream; failures on the error stream."""
        scope = trio.CancelScope()
        self._connections.add(scope)
        try:
            pod = None if self._pod_gone else self._current()
            if pod is None:
                await _quietly(error.send_all, portforward.sandbox_gone_error(
                    port=port, sandbox_id=sandbox_id(self._pod)).encode())
                return
            with scope:
                await self._relay(pod, port, error, data)
        finally:
            self._connections.discard(scope)
            # As the kubelet's deferred Close()s: both streams end from our side.
            with trio.move_on_after(1, shield=True):
                await _quietly(error.send_eof)
                await _quietly(data.send_eof)

    async def _relay(self, pod: dict[str, Any], port: int, error: PeerStream, data: PeerStream) -> None:
        """Connect to `port` in `pod` and copy both ways; nothing listening: the kubelet's message."""
        async with trio.open_nursery() as nursery:
            try:
                socket = await self._ctl.network.connect(self._ctl, pod, port, nursery)
            except ConnectionRefusedError:
                await _quietly(error.send_all, portforward.forward_error(
                    port=port, sandbox_id=sandbox_id(self._pod), netns=netns_path(self._pod),
                    reason="connection refused").encode())
                return
            try:
                nursery.start_soon(_stream_to_socket, data, socket)
                await _socket_to_stream(socket, data)
                # The pod's side is done: end the data stream, and give the client's direction
                # the second containerd gives it before both streams are closed.
                await _quietly(data.send_eof)
                nursery.cancel_scope.deadline = trio.current_time() + LINGER_SECONDS
            finally:
                socket.close()


async def _quietly(action: Callable[..., Awaitable[None]], *args: Any) -> None:
    """Do `action` on a stream the client may have reset or the connection may have lost."""
    try:
        await action(*args)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def _stream_to_socket(data: PeerStream, socket: trio.abc.HalfCloseableStream) -> None:
    try:
        while chunk := await data.receive_some(CHUNK):
            await socket.send_all(chunk)
        await socket.send_eof()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the server side closed: what the client still sends is dropped, as after a reset


async def _socket_to_stream(socket: trio.abc.HalfCloseableStream, data: PeerStream) -> None:
    try:
        while chunk := await socket.receive_some(CHUNK):
            await data.send_all(bytes(chunk))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


# -- the subresource -----------------------------------------------------------------------------


def port_forward_pod(store: Store, target: Target) -> dict[str, Any]:
    """The API server's checks before it hands `pods/portforward` to the kubelet.

    `PortForwardLocation` (pkg/registry/core/pod/strategy.go): the pod must exist (404 `pods "x"
    not found`) and be scheduled (400 `pod x does not have a host assigned`). kubectl itself
    refuses a pod that is not Running before it asks.
    """
    pod = store.get(target.kind, target.namespace, target.name or "")
    if not (pod.get("spec") or {}).get("nodeName"):
        raise errors.bad_request(f"pod {target.name} does not have a host assigned")
    return pod


def _check(request: PodStreamRequest) -> None:
    port_forward_pod(request.store, request.target)


async def _serve(request: PodStreamRequest, session: SpdySession) -> None:
    """One port-forward connection: every stream the client opens, until it goes away."""
    pod = port_forward_pod(request.store, request.target)
    store, kind, uid = request.store, request.target.kind, pod["metadata"].get("uid")

    def current() -> dict[str, Any] | None:
        now = store.find(kind, request.target.namespace, request.target.name or "")
        return now if now is not None and now["metadata"].get("uid") == uid else None

    async with trio.open_nursery() as nursery:
        forward = PortForwardSession(request.controllers, pod, nursery, current=current)

        async def watch() -> None:
            await store.wait_for(lambda: True if current() is None else None)
            forward.pod_gone()

        nursery.start_soon(watch)
        while (stream := await session.accept()) is not None:
            await forward.stream_opened(stream)
        nursery.cancel_scope.cancel()  # the client is gone: so are its connections


#: `pods/portforward` over SPDY, for the raw upgrade and kubectl's WebSocket tunnel alike.
PORT_FORWARD = SpdySubresource(protocols=(portforward.PROTOCOL,), check=_check, serve=_serve)
