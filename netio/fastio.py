"""Lean byte streams for the hot paths: a TCP stream and a TLS stream that yield only when they wait.

Trio's ``SocketStream`` and ``SSLStream`` make every call a schedule point: a successful ``send``
still ends in a trip through the scheduler, and ``SSLStream`` adds lock acquisitions that are each
another trip. A proxied request crosses these streams a dozen times per process, and on a small
machine each trip costs tens of microseconds (an ``epoll`` call plus the run loop's bookkeeping),
which was most of kasd's and agentd's per-request CPU.

These classes keep Trio's contracts that callers rely on — every call is a *cancel* point
(``checkpoint_if_cancelled``), errors are ``BrokenResourceError``/``ClosedResourceError``,
concurrent use of one direction raises ``BusyResourceError``, ``aclose`` wakes blocked callers —
but an operation that completes without waiting does not yield. So that a loop that never waits
cannot starve other tasks, every ``_YIELD_EVERY``-th such operation yields anyway (``maybe_yield``).

``FastTLSStream`` drives an ``ssl.SSLObject`` over memory BIOs, as ``SSLStream`` does, and gathers
every TLS record already received into one ``receive_some`` answer (``SSLStream`` returns one
record, at most 16 KiB, per call).

This module is the fence around what these fast paths rely on (STYLE §9). Only Trio's public API
is called (``trio.lowlevel.checkpoint_if_cancelled``, ``cancel_shielded_checkpoint``,
``wait_readable``/``wait_writable``, ``notify_closing``; ``trio.SocketStream.socket``), so no upper
bound of trio is pinned; what is assumed beyond Trio's documentation is its *behaviour*:

1. a task need not pass a schedule point on every stream call for Trio to stay fair and correct,
   as long as it does every so often and whenever it waits (Trio documents the opposite as its
   own streams' contract, not as a requirement on callers);
2. ``wait_readable``/``wait_writable`` on a socket that ``notify_closing`` was called for raise
   ``ClosedResourceError`` in the waiting task;
3. ``trio.SocketStream.socket`` can be detached and driven directly once the SocketStream is
   dropped.

``tests/netio/test_fastio.py`` checks each (naming it when it breaks) and runs Trio's own stream
conformance checks on these classes. With ``KASD_SAFE_MODE`` set (``netio.safemode``), every call
of these classes yields, ``fast_stream``/``tls_stream`` hand out Trio's own ``SocketStream`` and
``SSLStream``, and ``cancel_point``/``maybe_yield`` yield every time (``cancel_point`` is then
``checkpoint_if_cancelled`` + ``cancel_shielded_checkpoint``: exactly ``trio.lowlevel.checkpoint``).
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import ssl
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import trio

from netio.safemode import SAFE_MODE

__all__ = [
    "ConflictDetector",
    "FastSocketStream",
    "FastTLSStream",
    "cancel_point",
    "every_call_yields",
    "fast_stream",
    "is_loopback_host",
    "maybe_yield",
    "peer_host",
    "peer_name",
    "send_many",
    "tls_stream",
]

_YIELD_EVERY = 16  # wire_throughput: h2c 1 stream ~460-620 MB/s at 32, ~900 at 16; fewer favours latency
if SAFE_MODE:
    _YIELD_EVERY = 1  # every call a schedule point, as Trio's own streams
_yield_every = _YIELD_EVERY
_budget = _YIELD_EVERY
_DEFAULT_RECEIVE = 256 * 1024
_TLS_RECEIVE = 256 * 1024
_IOV_MAX = 1024  # buffers per sendmsg (Linux's limit)


async def maybe_yield() -> None:
    """Yield to the scheduler every so often: call after an operation that did not wait."""
    global _budget
    _budget -= 1
    if _budget <= 0:
        _budget = _yield_every
        await trio.lowlevel.cancel_shielded_checkpoint()


async def cancel_point() -> None:
    """A cancel point that is a schedule point only every so often (see ``maybe_yield``)."""
    await trio.lowlevel.checkpoint_if_cancelled()
    await maybe_yield()


def _waited() -> None:
    global _budget
    _budget = _yield_every


@contextmanager
def every_call_yields() -> Iterator[None]:
    """Make every operation a schedule point, as Trio's own streams are (for conformance tests:
    ``trio.testing.check_*_stream`` asserts that each call yields)."""
    global _yield_every, _budget
    saved = _yield_every
    _yield_every = _budget = 1
    try:
        yield
    finally:
        _yield_every = _budget = saved


class ConflictDetector:
    """Raises BusyResourceError when two tasks use the same direction of a stream at once."""

    __slots__ = ("_busy", "_msg")

    def __init__(self, msg: str) -> None:
        self._busy = False
        self._msg = msg

    def __enter__(self) -> None:
        if self._busy:
            raise trio.BusyResourceError(self._msg)
        self._busy = True

    def __exit__(self, *exc: object) -> None:
        self._busy = False


class FastSocketStream(trio.abc.HalfCloseableStream):
    """A connected stream socket (TCP or Unix) as a Trio stream; see the module docstring."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        #: the stdlib socket (``getpeername``, ``setsockopt`` …)
        self.socket = sock
        self._closed = False
        self._eof_sent = False
        #: called once, as the socket closes (``netio.admission`` frees the connection's slot)
        self.on_close: Callable[[], None] | None = None
        # Who is sending or receiving now: BusyResourceError for a second task (ConflictDetector's
        # rule, kept in two flags here: a ``with`` of a detector was 2 Python calls per operation).
        self._send_busy = False
        self._recv_busy = False

    @classmethod
    def from_trio(cls, stream: trio.SocketStream) -> FastSocketStream:
        """Take over the socket of a ``trio.SocketStream`` (which must not be used afterwards)."""
        return cls(socket.socket(fileno=stream.socket.detach()))

    def _check_open(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("stream was closed")

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.send_many([data if isinstance(data, bytes) else memoryview(data).cast("B")])

    async def send_many(self, buffers: Sequence[bytes | bytearray | memoryview]) -> None:
        """``send_all(b"".join(buffers))`` without the join: one ``sendmsg`` for many buffers."""
        if self._send_busy:
            raise trio.BusyResourceError("another task is sending on this stream")
        self._send_busy = True
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            if self._closed:
                raise trio.ClosedResourceError("stream was closed")
            if self._eof_sent:
                raise trio.ClosedResourceError("cannot send data after sending EOF")
            sock = self.socket
            pending: list[bytes | bytearray | memoryview] = list(filter(None, buffers))  # no empty buffer: see the loop
            start = 0
            waited = False
            while start < len(pending):
                try:
                    sent = sock.sendmsg(pending[start : start + _IOV_MAX])
                except BlockingIOError:
                    waited = True
                    await self._wait(trio.lowlevel.wait_writable)
                    continue
                except OSError as exc:
                    self._check_open()
                    raise trio.BrokenResourceError(f"socket send failed: {exc}") from exc
                while sent:
                    size = len(pending[start])
                    if sent >= size:
                        sent -= size
                        start += 1
                    else:
                        pending[start] = memoryview(pending[start])[sent:]
                        sent = 0
            if waited:
                _waited()
            else:
                await maybe_yield()
        finally:
            self._send_busy = False

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if max_bytes is None:
            max_bytes = _DEFAULT_RECEIVE
        elif max_bytes < 1:
            raise ValueError("max_bytes must be >= 1")
        if self._recv_busy:
            raise trio.BusyResourceError("another task is receiving on this stream")
        self._recv_busy = True
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            sock = self.socket
            while True:
                if self._closed:
                    raise trio.ClosedResourceError("stream was closed")
                try:
                    data = sock.recv(max_bytes)
                except BlockingIOError:
                    await self._wait(trio.lowlevel.wait_readable)
                    _waited()
                    continue
                except OSError as exc:
                    self._check_open()
                    raise trio.BrokenResourceError(f"socket receive failed: {exc}") from exc
                await maybe_yield()
                return data
        finally:
            self._recv_busy = False

    async def _wait(self, wait: object) -> None:
        try:
            await wait(self.socket)  # type: ignore[operator]
        except trio.ClosedResourceError:
            raise trio.ClosedResourceError("stream was closed") from None

    async def send_eof(self) -> None:
        if self._send_busy:
            raise trio.BusyResourceError("another task is sending on this stream")
        self._send_busy = True
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            if self._closed:
                raise trio.ClosedResourceError("stream was closed")
            self._eof_sent = True
            try:
                self.socket.shutdown(socket.SHUT_WR)
            except OSError as exc:
                if exc.errno != errno.ENOTCONN:
                    raise trio.BrokenResourceError(f"socket shutdown failed: {exc}") from exc
            await maybe_yield()
        finally:
            self._send_busy = False

    async def wait_send_all_might_not_block(self) -> None:
        if self._send_busy:
            raise trio.BusyResourceError("another task is sending on this stream")
        self._send_busy = True
        try:
            if self._closed:
                raise trio.ClosedResourceError("stream was closed")
            await self._wait(trio.lowlevel.wait_writable)
        finally:
            self._send_busy = False

    def setsockopt(self, level: int, option: int, value: int | bytes) -> None:
        self.socket.setsockopt(level, option, value)

    def getsockopt(self, level: int, option: int) -> int:
        return self.socket.getsockopt(level, option)

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            trio.lowlevel.notify_closing(self.socket)
            self.socket.close()
            if self.on_close is not None:
                self.on_close()  # before the checkpoint: a cancelled aclose still frees the slot
        await trio.lowlevel.checkpoint()


async def send_many(stream: trio.abc.SendStream, buffers: Sequence[bytes | bytearray | memoryview]) -> None:
    """Send ``buffers`` in order: vectored where the stream can, else joined into one write."""
    if isinstance(stream, (FastSocketStream, FastTLSStream)):
        await stream.send_many(buffers)
    else:
        await stream.send_all(b"".join(buffers))


def peer_name(stream: trio.abc.Stream) -> str:
    """``host:port`` of the stream's socket peer (for log lines), or ``?``."""
    sock = getattr(stream, "socket", None)
    try:
        host, port = sock.getpeername()[:2] if sock is not None else ("?", 0)
    except OSError:
        return "?"
    return f"{host}:{port}"


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) stays on this machine: what crosses no network.
    A wildcard (``0.0.0.0``, ``::``, empty) is every interface, so no."""
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: where it resolves is not ours to promise


def peer_host(peer: str) -> str:
    """The host of a ``peer_name`` (``host:port``; ``?`` stays ``?``): what the log lines a stranger
    can repeat are keyed by, one key per address."""
    return peer.rpartition(":")[0] or peer


def fast_stream(stream: trio.abc.Stream) -> trio.abc.Stream:
    """``stream`` as a FastSocketStream when it is a plain ``trio.SocketStream``; otherwise as it is
    (always as it is under KASD_SAFE_MODE)."""
    if type(stream) is trio.SocketStream and not SAFE_MODE:
        return FastSocketStream.from_trio(stream)
    return stream


def tls_stream(
    transport_stream: trio.abc.Stream,
    ssl_context: ssl.SSLContext,
    *,
    server_side: bool = False,
    server_hostname: str | None = None,
    https_compatible: bool = False,
) -> FastTLSStream | trio.SSLStream[trio.abc.Stream]:
    """TLS over ``transport_stream``: a FastTLSStream, or Trio's ``SSLStream`` under KASD_SAFE_MODE.
    Both offer ``do_handshake()``, ``selected_alpn_protocol()`` and ``getpeercert()``."""
    if SAFE_MODE:
        return trio.SSLStream(
            transport_stream,
            ssl_context,
            server_side=server_side,
            server_hostname=server_hostname,
            https_compatible=https_compatible,
        )
    return FastTLSStream(
        transport_stream,
        ssl_context,
        server_side=server_side,
        server_hostname=server_hostname,
        https_compatible=https_compatible,
    )


class FastTLSStream(trio.abc.Stream):
    """TLS over a byte stream (normally a FastSocketStream); see the module docstring.

    As with ``trio.SSLStream``: the handshake happens on first use or ``do_handshake()``; errors are
    ``BrokenResourceError`` with the ``ssl.SSLError`` as ``__cause__``; ``https_compatible`` means no
    close_notify is sent and an EOF without one reads as a clean end.
    """

    def __init__(
        self,
        transport_stream: trio.abc.Stream,
        ssl_context: ssl.SSLContext,
        *,
        server_side: bool = False,
        server_hostname: str | None = None,
        https_compatible: bool = False,
    ) -> None:
        self.transport_stream = transport_stream
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl = ssl_context.wrap_bio(
            self._incoming, self._outgoing, server_side=server_side, server_hostname=server_hostname
        )
        self._https_compatible = https_compatible
        self._handshook = False
        self._handshaking: trio.Event | None = None
        self._broken: BaseException | None = None
        self._closed = False
        self._eof = False
        self._sending = False
        # Who is sending or receiving now: BusyResourceError for a second task (ConflictDetector's
        # rule, kept in two flags here: a ``with`` of a detector was 2 Python calls per operation).
        self._send_busy = False
        self._recv_busy = False

    # ---- what SSLStream offers that callers use

    @property
    def socket(self) -> socket.socket | None:
        return getattr(self.transport_stream, "socket", None)

    def selected_alpn_protocol(self) -> str | None:
        return self._ssl.selected_alpn_protocol()

    def getpeercert(self, binary_form: bool = False) -> object:
        return self._ssl.getpeercert(binary_form)

    def version(self) -> str | None:
        return self._ssl.version()

    # ---- internals

    def _check_usable(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("stream was closed")
        if self._broken is not None:
            raise trio.BrokenResourceError("TLS stream is broken") from self._broken

    def _break(self, exc: BaseException) -> trio.BrokenResourceError:
        self._broken = exc
        return trio.BrokenResourceError(f"TLS failed: {exc}")

    async def _flush(self) -> None:
        """Hand what the TLS object wrote to the transport; one task at a time moves the bytes, and
        it keeps going until none are left (so bytes another task added go out in order)."""
        if self._sending:
            return
        self._sending = True
        try:
            while self._outgoing.pending:
                try:
                    await self.transport_stream.send_all(self._outgoing.read())
                except trio.BrokenResourceError as exc:
                    raise self._break(exc) from exc
        finally:
            self._sending = False

    async def _read_transport(self) -> None:
        try:
            data = await self.transport_stream.receive_some(_TLS_RECEIVE)
        except trio.BrokenResourceError as exc:
            raise self._break(exc) from exc
        if data:
            self._incoming.write(data)
        else:
            self._incoming.write_eof()

    async def do_handshake(self) -> None:
        self._check_usable()
        if self._handshook:
            await trio.lowlevel.checkpoint()
            return
        if self._handshaking is not None:
            # Another task (a relay's other direction) is shaking hands: wait for its outcome.
            await self._handshaking.wait()
            if self._closed or self._broken is not None:
                self._check_usable()
            return
        await trio.lowlevel.checkpoint_if_cancelled()
        self._handshaking = trio.Event()
        try:
            await self._handshake()
        except BaseException as exc:
            # Half a handshake cannot be resumed (cancelled mid-way included): the stream is broken.
            if self._broken is None:
                self._broken = exc
            raise
        finally:
            self._handshaking.set()

    async def _handshake(self) -> None:
        while True:
            try:
                self._ssl.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self._flush()
                await self._read_transport()
            except ssl.SSLError as exc:
                try:
                    await self._flush()  # the alert that says why
                except trio.BrokenResourceError:
                    pass
                raise self._break(exc) from exc
        self._handshook = True
        await self._flush()

    # ---- the stream

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if max_bytes is None:
            max_bytes = _DEFAULT_RECEIVE
        elif max_bytes < 1:
            raise ValueError("max_bytes must be >= 1")
        if self._recv_busy:
            raise trio.BusyResourceError("another task is receiving on this stream")
        self._recv_busy = True
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            if self._closed or self._broken is not None:
                self._check_usable()
            if not self._handshook:
                await self.do_handshake()
            if self._eof:
                await maybe_yield()
                return b""
            read = False
            while True:
                data = self._read_available(max_bytes)
                if data is not None:
                    break
                if self._outgoing.pending:
                    await self._flush()  # post-handshake replies (key update)
                await self._read_transport()
                read = True
            # Replies this read made (a KeyUpdate's answer) go out with the next send, or before the
            # next wait for bytes (above), not here: a flush here could be cut by the caller's deadline
            # (a session's keepalive timer cuts its reads) and take the data read with it.
            if not read:
                await maybe_yield()
            return data
        finally:
            self._recv_busy = False

    def _read_available(self, max_bytes: int) -> bytes | None:
        """Decrypted bytes already here (b"" at the end), or None when more must be read first."""
        tls = self._ssl
        try:
            data = tls.read(max_bytes)
        except ssl.SSLWantReadError:
            return None
        except ssl.SSLZeroReturnError:
            self._eof = True  # the peer's close_notify
            return b""
        except ssl.SSLEOFError as exc:
            if self._https_compatible:
                self._eof = True
                return b""
            raise self._break(exc) from exc
        except ssl.SSLError as exc:
            raise self._break(exc) from exc
        # Gather the records already here too (each read returns at most one 16 KiB record).
        if data and len(data) < max_bytes and (tls.pending() or self._incoming.pending):
            parts = [data]
            size = len(data)
            while size < max_bytes:
                try:
                    more = tls.read(max_bytes - size)
                except ssl.SSLError:
                    break  # want-read, or an end/error that the next call reports
                if not more:
                    break
                parts.append(more)
                size += len(more)
            data = b"".join(parts)
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.send_many([data])

    async def send_many(self, buffers: Sequence[bytes | bytearray | memoryview]) -> None:
        """``send_all`` of the buffers joined, without joining them (TLS copies them anyway)."""
        if self._send_busy:
            raise trio.BusyResourceError("another task is sending on this stream")
        self._send_busy = True
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            if self._closed or self._broken is not None:
                self._check_usable()
            if not self._handshook:
                await self.do_handshake()
            try:
                for buffer in buffers:
                    if buffer:
                        self._ssl.write(buffer)
            except ssl.SSLError as exc:
                raise self._break(exc) from exc
            if self._outgoing.pending:
                await self._flush()
            else:
                await maybe_yield()
        finally:
            self._send_busy = False

    async def wait_send_all_might_not_block(self) -> None:
        if self._send_busy:
            raise trio.BusyResourceError("another task is sending on this stream")
        self._send_busy = True
        try:
            if self._closed or self._broken is not None:
                self._check_usable()
            await self.transport_stream.wait_send_all_might_not_block()
        finally:
            self._send_busy = False

    async def aclose(self) -> None:
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        try:
            if (
                self._handshook
                and self._broken is None
                and not self._https_compatible
                and not self._sending
            ):
                # One close_notify, without waiting for the peer's (as trio.SSLStream does).
                try:
                    self._ssl.unwrap()
                except ssl.SSLError:
                    pass
                try:
                    await self._flush()
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
        finally:
            self._closed = True
            await self.transport_stream.aclose()
