"""A Trio session over any ``trio.abc.Stream``: the mux core plus one reader task and one writer task.

Logical streams are ``trio.abc.HalfCloseableStream``s. Nothing here buffers without bound: received
bytes are bounded by each stream's credit window, outbound bytes by a high-water mark that senders
(and the reader, for control replies) wait on, and unaccepted incoming streams by a backlog past which
new ones are refused.
"""

from __future__ import annotations

import logging
import math
import operator
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from netio.fastio import ConflictDetector, cancel_point, maybe_yield
from wire.errors import ErrorCode, LocalProtocolError, RemoteProtocolError, UnsendableFrameError
from wire.events import (
    DataReceived,
    Event,
    GoAwayReceived,
    HandshakeCompleted,
    NoticeReceived,
    PongReceived,
    StreamAccepted,
    StreamEnded,
    StreamOpened,
    StreamRefused,
    StreamReset,
    WindowUpdated,
)
from wire.frames import Metadata
from wire.mux import MuxConnection, StreamInfo
from wire.settings import KiB, Limits, MiB, Settings
from wire.streamstate import StreamState

log = logging.getLogger("wire.session")

_RECEIVE_SIZE = 256 * KiB
#: bytes handed to the transport in one write, about (``MuxConnection.data_to_send``): three DATA
#: frames of 64 KiB. One join of all that is queued (up to the high-water mark and more) cost more
#: per byte than the writes it saved; and a write under ``_RECEIVE_SIZE`` reaches the peer's reader
#: over h2 as one HTTP/2 frame it need not cut (a copy). Measured: docs/benchmarks.md, issue 30.
_WRITE_SIZE = 192 * KiB
#: largest slice of one send_all queued before re-checking the outbound high-water mark
_SEND_CHUNK = 256 * KiB
_CLOSE_TIMEOUT = 5.0
#: how long the reader may go on once the transport took no more writes: the peer's last frames
#: (the end of a response) may still be waiting to be read, and a close that crossed our write
#: must not lose them
_READ_AFTER_WRITES_FAILED = 2.0
#: NOTICEs kept for a receiver that has not set ``on_notice`` yet (the newest win: a later
#: placement supersedes an earlier one)
MAX_EARLY_NOTICES = 16


class SessionClosedError(trio.BrokenResourceError):
    """The session is gone: the peer left, broke the protocol, timed out, or we closed it."""

    def __init__(self, reason: str, code: int = ErrorCode.NO_ERROR) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


class StreamResetError(trio.BrokenResourceError):
    def __init__(self, code: int, message: str, *, remote: bool) -> None:
        who = "peer" if remote else "this side"
        super().__init__(f"stream reset by {who}: {ErrorCode.describe(code)} {message}".rstrip())
        self.code = code
        self.message = message
        self.remote = remote


class StreamRefusedError(trio.BrokenResourceError):
    """The peer refused the stream (or never processed it before a GOAWAY): safe to retry elsewhere."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"stream refused: {ErrorCode.describe(code)} {message}".rstrip())
        self.code = code
        self.message = message


@attrs.frozen(kw_only=True)
class SessionStatistics:
    open_streams: int
    local_streams: int
    remote_streams: int
    pending_accept: int
    streams_refused: int
    bytes_sent: int
    bytes_received: int
    outbound_buffered: int
    rtt: float | None
    goaway_sent: bool
    goaway_received: bool
    closed: bool
    streams: tuple[StreamInfo, ...]


class MuxStream(trio.abc.HalfCloseableStream):
    """One logical stream of a session."""

    def __init__(self, session: Session, stream_id: int, metadata: Metadata, *, local: bool) -> None:
        self.session = session
        self.stream_id = stream_id
        #: the OPEN frame's metadata (for kasd/agentd: the request head)
        self.metadata = metadata
        self.local = local
        #: the ACCEPT frame's metadata, once accepted
        self.accept_metadata: Metadata | None = None
        self._accepted = trio.Event()
        self._buffer: deque[bytes] = deque()
        self._eof = False
        self._recv_error: BaseException | None = None
        self._send_error: BaseException | None = None
        self._eof_sent = False
        self._closed = False
        self._lot = trio.lowlevel.ParkingLot()
        self._send_conflict = ConflictDetector("another task is sending on this stream")
        self._recv_conflict = ConflictDetector("another task is receiving on this stream")
        self._break_scopes: list[trio.CancelScope] = []

    def __repr__(self) -> str:
        return f"<MuxStream {self.stream_id} {self.session.connection.stream_state(self.stream_id).value}>"

    # ---- accept / refuse (incoming streams) and waiting for accept (outgoing)

    async def accept(self, metadata: Metadata | None = None) -> None:
        """Accept an incoming stream, answering with ``metadata`` (sent automatically on first send)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._accept_now(metadata):
            # The ACCEPT must go out now even if nothing follows it (a 101 waits for the client).
            self.session._wake_writer()
        await maybe_yield()

    def _accept_now(self, metadata: Metadata | None = None) -> bool:
        """Queue the ACCEPT of an incoming stream not yet accepted (True); the caller writes it."""
        if self.local or self._accepted.is_set():
            return False
        self._check_usable()
        self.session._call(self.session.connection.accept_stream, self.stream_id, metadata)
        self.accept_metadata = dict(metadata or {})
        self._accepted.set()
        return True

    async def refuse(self, code: int = ErrorCode.REFUSED_STREAM, message: str = "") -> None:
        if self.local or self._accepted.is_set():
            raise LocalProtocolError("only an incoming stream not yet accepted can be refused")
        await trio.lowlevel.checkpoint_if_cancelled()
        self._closed = True
        self.session._call(self.session.connection.refuse_stream, self.stream_id, code, message)
        self.session._forget(self.stream_id)
        await maybe_yield()

    async def wait_accepted(self) -> Metadata:
        """For a stream this side opened: the peer's ACCEPT metadata, or StreamRefusedError."""
        await self._accepted.wait()
        if self.accept_metadata is None:
            raise self._recv_error or trio.BrokenResourceError("stream closed before it was accepted")
        return self.accept_metadata

    # ---- sending

    def _check_usable(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("stream was closed")

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        with self._send_conflict:
            self._check_usable()
            if self._send_error is not None:
                raise self._send_error
            if self._eof_sent:
                raise trio.ClosedResourceError("send_eof was called on this stream")
            await trio.lowlevel.checkpoint_if_cancelled()
            accepting = self._accept_now()  # written with the data
            view = memoryview(data).cast("B")
            session = self.session
            sent_any = False
            try:
                while view:
                    await session._wait_outbound_room()
                    session._raise_if_unwritable()
                    self._check_usable()
                    if self._send_error is not None:
                        raise self._send_error
                    taken = session._call(session.connection.send_data, self.stream_id, view[:_SEND_CHUNK])
                    if taken:
                        sent_any = True
                        view = view[taken:]
                        # Left to the writer task, not written from here: a sender returns at once
                        # below the high-water mark, and what several sends queue meanwhile goes
                        # out in one write (writing through cost more CPU per request, measured).
                        session._wake_writer()
                    else:
                        await self._lot.park()
            except trio.Cancelled:
                if sent_any:
                    self._send_error = trio.BrokenResourceError("an earlier send_all was cancelled midway")
                raise
            if accepting and not sent_any:
                session._wake_writer()  # the ACCEPT alone
            await maybe_yield()

    async def wait_send_all_might_not_block(self) -> None:
        with self._send_conflict:
            self._check_usable()
            await trio.lowlevel.checkpoint()
            while (
                self._send_error is None
                and not self._closed
                and self.session.connection.send_window(self.stream_id) == 0
                and self.session.connection.stream_state(self.stream_id) is not StreamState.CLOSED
            ):
                await self._lot.park()
            self._check_usable()

    async def send_eof(self) -> None:
        with self._send_conflict:
            self._check_usable()
            await cancel_point()
            if self._eof_sent:
                return
            if self._send_error is not None:
                raise self._send_error
            self._accept_now()  # written with the END
            self._eof_sent = True
            session = self.session
            session._call(session.connection.end_stream, self.stream_id)
            if session.connection.stream_state(self.stream_id) is StreamState.CLOSED:
                session._forget(self.stream_id, wake=False)
            session._wake_writer()

    # ---- receiving

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if max_bytes is not None:
            max_bytes = operator.index(max_bytes)
            if max_bytes < 1:
                raise ValueError("max_bytes must be >= 1")
        with self._recv_conflict:
            self._check_usable()
            await cancel_point()
            while not self._buffer and not self._eof and self._recv_error is None:
                await self._lot.park()
                self._check_usable()
            return self._take(max_bytes)

    def receive_nowait(self, max_bytes: int | None = None) -> bytes:
        """What ``receive_some`` would return, without waiting: bytes already received, ``b""`` at
        the end, the stream's error — or ``trio.WouldBlock`` when it would have to wait."""
        with self._recv_conflict:
            self._check_usable()
            if not self._buffer and not self._eof and self._recv_error is None:
                raise trio.WouldBlock
            return self._take(max_bytes)

    def _take(self, max_bytes: int | None) -> bytes:
        if self._buffer:
            chunk = self._buffer[0]
            if max_bytes is None or len(chunk) <= max_bytes:
                self._buffer.popleft()
            else:
                self._buffer[0] = chunk[max_bytes:]
                chunk = chunk[:max_bytes]
            self.session._acknowledge(self.stream_id, len(chunk))
            return chunk
        if self._eof:
            return b""
        assert self._recv_error is not None
        raise self._recv_error

    async def wait_broken(self) -> BaseException:
        """Return (not raise) the error once the peer reset this stream or its session died.

        A stream whose peer already half-closed keeps answering ``receive_some`` with EOF, so a
        proxy waiting on a long response uses this to learn that its client went away.
        """
        while self._send_error is None and not self._closed:
            await self._lot.park()
        return self._send_error or trio.ClosedResourceError("stream was closed")

    def cancel_when_broken(self, scope: trio.CancelScope) -> None:
        """Cancel ``scope`` once the peer resets this stream or its session dies: ``wait_broken``
        without a task to wait in (a proxy cancels its upstream exchange this way)."""
        if self._send_error is not None:
            scope.cancel()
        else:
            self._break_scopes.append(scope)

    # ---- closing

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self.session._close_stream(self)
            self._lot.unpark_all()
        await cancel_point()

    async def reset(self, code: int = ErrorCode.CANCEL, message: str = "") -> None:
        """Abort the stream both ways with an error code the peer sees."""
        if not self._closed:
            self._closed = True
            self.session._call_quiet(self.session.connection.reset_stream, self.stream_id, code, message)
            self.session._after_local_change(self.stream_id)
            self._lot.unpark_all()
        await cancel_point()

    # ---- called by the session's reader

    def _on_data(self, data: bytes) -> None:
        self._buffer.append(data)
        self._lot.unpark_all()

    def _on_fail(self, error: BaseException) -> None:
        if self._recv_error is None and not self._eof:
            self._recv_error = error
        if self._send_error is None:
            self._send_error = error
        if self.accept_metadata is None and not self._accepted.is_set():
            self._recv_error = self._recv_error or error
            self._accepted.set()
        self._lot.unpark_all()
        scopes, self._break_scopes = self._break_scopes, []
        for scope in scopes:
            scope.cancel()


class Session(trio.abc.AsyncResource):
    """A multiplexed session over one byte stream. Start it with ``open_session``/``connect_session``."""

    def __init__(
        self,
        transport: trio.abc.Stream,
        *,
        client: bool,
        settings: Settings | None = None,
        limits: Limits | None = None,
        metadata: Metadata | None = None,
        keepalive_interval: float = 15.0,
        keepalive_timeout: float = 45.0,
        handshake_timeout: float = 10.0,
        accept_backlog: int | None = None,
        outbound_high_water: int = 1 * MiB,
        name: str = "",
    ) -> None:
        self.transport = transport
        self.connection = MuxConnection(client=client, settings=settings, limits=limits, metadata=metadata)
        self.keepalive_interval = keepalive_interval
        self.keepalive_timeout = keepalive_timeout
        # The side that dialled keeps an idle session alive; the side that accepted pings only if
        # the dialler fell silent for twice as long. Otherwise both timers, reset by the same
        # PING/PONG, fire together and every idle session costs two exchanges per interval (half
        # of an idle kasd's CPU with 10,000 agents).
        self._ping_after = keepalive_interval if client else 2 * keepalive_interval
        self.handshake_timeout = handshake_timeout
        self.name = name or ("client" if client else "server")
        self._high_water = outbound_high_water
        self._streams: dict[int, MuxStream] = {}
        # By default every stream the peer may open can wait to be accepted: the concurrency limit,
        # not a smaller backlog, is what bounds it (a burst of opens is normal for a proxy).
        backlog = accept_backlog if accept_backlog is not None else self.connection.local_settings.max_concurrent_streams
        self._accept_send, self._accept_recv = trio.open_memory_channel[MuxStream](backlog)
        self._on_stream: Callable[[MuxStream], None] | None = None
        self._on_notice: Callable[[Metadata], None] | None = None
        # NOTICEs read before anyone set ``on_notice`` (a peer may send one right after the
        # handshake, before its receiver got the session): handed over when it is set
        self._early_notices: deque[Metadata] | None = None  # made on the first one (idle sessions are many)
        self._writer_wakeup = trio.Event()
        #: the session's tasks; the writer task is started there the first time it is needed
        self._nursery: trio.Nursery | None = None
        self._writer_started = False
        #: the handshake is done (``run``'s ``started`` fired)
        self._started = False
        self._drained = trio.lowlevel.ParkingLot()
        self._slots = trio.lowlevel.ParkingLot()
        self._handshake = trio.Event()
        self._closed_event = trio.Event()
        self._goaway_event = trio.Event()
        self._pongs: dict[int, trio.Event] = {}
        self._last_received = 0.0
        self._writing = False
        # The writer's send in progress (shielded: a frame is never cut midway nor dropped once
        # taken from the core), and when sends must give up once the session is being torn down
        self._send_scope: trio.CancelScope | None = None
        #: why the transport took no more writes; the reader goes on for what the peer sent before
        self._writes_failed: SessionClosedError | None = None
        self._last_write_by = math.inf
        self._cancel_scope: trio.CancelScope | None = None
        #: why the session ended (None while alive)
        self.close_reason: SessionClosedError | None = None

    # ------------------------------------------------------------------ public API

    @property
    def peer_metadata(self) -> Metadata:
        return self.connection.peer_metadata

    @property
    def closed(self) -> bool:
        return self.close_reason is not None

    @property
    def active_streams(self) -> int:
        """Streams in use (opened or accepted, not yet finished): a cheap load figure."""
        return len(self._streams)

    @property
    def draining(self) -> bool:
        """No new stream may be opened here: GOAWAY either way, or the transport takes no more writes."""
        return (self.connection.goaway_received is not None or self.connection.goaway_sent is not None
                or self._writes_failed is not None)

    async def open_stream(self, metadata: Metadata | None = None) -> MuxStream:
        """Open a logical stream; waits while the peer's concurrent-stream limit is reached."""
        await cancel_point()
        while True:
            try:
                return self.open_stream_nowait(metadata)
            except trio.WouldBlock:
                await self._slots.park()

    def open_stream_nowait(self, metadata: Metadata | None = None) -> MuxStream:
        """``open_stream`` without waiting: ``trio.WouldBlock`` while the peer's limit is reached.

        Metadata this side cannot send (over the limits, not encodable) raises
        ``UnsendableFrameError`` as itself, not a ``trio.BrokenResourceError``: it says nothing about
        this session, so a caller must not take it for one that is broken and try another.
        """
        self._raise_if_unwritable()
        conn = self.connection
        if conn.goaway_received is not None or conn.goaway_sent is not None:
            raise StreamRefusedError(ErrorCode.REFUSED_STREAM, "session is draining (GOAWAY)")
        if not conn.can_open_stream():
            raise trio.WouldBlock
        try:
            stream_id = conn.open_stream(metadata)
        except UnsendableFrameError:
            raise
        except LocalProtocolError as exc:
            raise trio.BrokenResourceError(str(exc)) from exc
        stream = MuxStream(self, stream_id, dict(metadata or {}), local=True)
        self._streams[stream_id] = stream
        self._wake_writer()
        return stream

    @property
    def on_notice(self) -> Callable[[Metadata], None] | None:
        """Called (in the reader; must not block) with the metadata of each NOTICE the peer sends.
        NOTICEs that came before it was set are passed to it at once, oldest first (at most
        ``MAX_EARLY_NOTICES``, the newest kept), as ``hand_streams_to`` hands over queued streams."""
        return self._on_notice

    @on_notice.setter
    def on_notice(self, handler: Callable[[Metadata], None] | None) -> None:
        self._on_notice = handler
        while handler is not None and self._early_notices:
            self._notify(handler, self._early_notices.popleft())

    def _notify(self, handler: Callable[[Metadata], None], metadata: Metadata) -> None:
        try:
            handler(metadata)
        except Exception:  # a receiver's bug must not end the session
            log.exception("notice handler failed name=%s", self.name)

    def hand_streams_to(self, on_stream: Callable[[MuxStream], None]) -> None:
        """From now on, call ``on_stream`` with each stream the peer opens, as its OPEN is read,
        instead of queuing it for ``accept_stream`` (streams already queued go first). A server
        that starts a task per stream saves the scheduler round of an accept loop this way.

        ``on_stream`` runs in the session's reader and must not block; if it raises (say, its
        nursery is closing), the stream is refused, so the peer may retry it elsewhere, and the
        session goes on.
        """
        self._on_stream = on_stream
        while True:
            try:
                stream = self._accept_recv.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            self._hand_over(stream)

    def _hand_over(self, stream: MuxStream) -> None:
        assert self._on_stream is not None
        sid = stream.stream_id
        self._streams[sid] = stream  # before the handler runs: this batch may hold its data
        try:
            self._on_stream(stream)
        except Exception as exc:
            # Not served at all, so the peer may safely retry it elsewhere: refuse, as for a full backlog.
            log.warning("refused stream name=%s stream=%d reason=handler-not-started error=%r", self.name, sid, exc)
            del self._streams[sid]
            stream._on_fail(trio.BrokenResourceError(f"refused: stream handler could not start: {exc}"))
            self._call_quiet(self.connection.refuse_stream, sid, ErrorCode.REFUSED_STREAM, "cannot serve the stream")
            self._wake_writer()

    async def accept_stream(self) -> MuxStream:
        """The next stream the peer opened. Accept it (or just use it), or refuse it."""
        try:
            return await self._accept_recv.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise self.close_reason or SessionClosedError("session closed") from None

    async def ping(self) -> float:
        """Round-trip time to the peer, in seconds."""
        self._raise_if_closed()
        opaque = self._call(self.connection.ping, trio.current_time())
        event = self._pongs[opaque] = trio.Event()
        self._wake_writer()
        try:
            while not event.is_set():
                await event.wait()
        finally:
            self._pongs.pop(opaque, None)
        self._raise_if_closed()
        return self.connection.rtt or 0.0

    async def send_notice(self, metadata: Metadata) -> bool:
        """Send a NOTICE; False (nothing sent) when the peer's protocol predates it."""
        self._raise_if_closed()
        sent = self._call(self.connection.notice, metadata)
        if sent:
            self._wake_writer()
        await trio.lowlevel.checkpoint()
        return bool(sent)

    async def wait_goaway(self) -> None:
        """Return once the peer sent GOAWAY (or the session ended): time to dial a replacement."""
        await self._goaway_event.wait()

    async def wait_closed(self) -> None:
        await self._closed_event.wait()

    async def drain(self, message: str = "draining") -> None:
        """Send GOAWAY and wait until every stream has finished and everything they sent was handed
        to the transport. Bound it with a cancel scope."""
        if not self.closed:
            self._call_quiet(self.connection.goaway, ErrorCode.NO_ERROR, message)
            self._wake_writer()
        while self._streams and not self.closed:
            await self._slots.park()
        # A stream is forgotten as its last frames are queued: they must be written before this
        # returns, or a caller that closes the session next (a daemon's shutdown) would cut them.
        await self._flush()
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        """Close now: GOAWAY, then the transport. Every stream still open sees SessionClosedError."""
        if not self.closed:
            self._call_quiet(self.connection.goaway, ErrorCode.NO_ERROR, "session closed")
            with trio.move_on_after(_CLOSE_TIMEOUT, shield=True):
                await self._flush()
            self._shutdown(SessionClosedError("session closed by this side"))
        with trio.move_on_after(_CLOSE_TIMEOUT, shield=True):
            await self.transport.aclose()
        await trio.lowlevel.checkpoint()

    def statistics(self) -> SessionStatistics:
        conn = self.connection
        return SessionStatistics(
            open_streams=len(conn.open_stream_ids),
            local_streams=conn.local_stream_count,
            remote_streams=conn.peer_stream_count,
            pending_accept=self._accept_recv.statistics().current_buffer_used,
            streams_refused=conn.streams_refused,
            bytes_sent=conn.bytes_sent,
            bytes_received=conn.bytes_received,
            outbound_buffered=conn.outbound_size,
            rtt=conn.rtt,
            goaway_sent=conn.goaway_sent is not None,
            goaway_received=conn.goaway_received is not None,
            closed=self.closed,
            streams=tuple(conn.streams()),
        )

    # ------------------------------------------------------------------ lifetime

    async def run(self, *, task_status: trio.TaskStatus[Session] = trio.TASK_STATUS_IGNORED) -> None:
        """Handshake, then serve until the session ends. ``started`` fires once the handshake is done.

        Raises SessionClosedError only when the handshake fails; later endings are reported through
        ``close_reason`` and to every stream, so one dead session never takes its nursery down.
        """
        self.connection.initiate()
        self._last_received = trio.current_time()
        with trio.CancelScope() as scope:
            self._cancel_scope = scope
            try:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    # This task is the reader, the keepalive timer and the bound of the last
                    # writes: an idle session runs one task, and the writer only once it is needed.
                    try:
                        await self._serve(task_status)
                    finally:
                        # Torn down (cancelled, or ``_shutdown``): the writer's last sends get
                        # ``_CLOSE_TIMEOUT``.
                        self._cut_writes(trio.current_time() + _CLOSE_TIMEOUT)
            finally:
                if not self.closed:
                    self._shutdown(SessionClosedError("session task cancelled"))
                self._nursery = None
                with trio.move_on_after(_CLOSE_TIMEOUT, shield=True):
                    await self.transport.aclose()
        if not self._started:
            # The handshake failed: say why to whoever is waiting in nursery.start().
            raise self.close_reason or SessionClosedError("session ended before its handshake")

    def _raise_if_closed(self) -> None:
        if self.close_reason is not None:
            raise self.close_reason

    def _transport_failed(self, exc: BaseException) -> SessionClosedError:
        goaway = self.connection.goaway_received
        if goaway is not None and goaway.code == ErrorCode.NO_ERROR and not self._streams:
            # The peer said it was leaving (agentd moving a tunnel, a restart) and nothing was in
            # flight: its close crossed our last write (a reset). It left; nothing failed.
            return SessionClosedError("peer closed the connection after GOAWAY (NO_ERROR)")
        return SessionClosedError(f"transport failed: {exc!r}", ErrorCode.INTERNAL_ERROR)

    def _shutdown(self, reason: SessionClosedError) -> None:
        """Mark the session dead (idempotent): fail every stream, stop the tasks."""
        if self.close_reason is not None:
            return
        self.close_reason = reason
        if reason.code != ErrorCode.NO_ERROR:
            # A failed session (transport, protocol, keepalive) has nothing more worth writing:
            # the writer stops at once rather than taking its close timeout.
            self._cut_writes(trio.current_time())
        level = logging.INFO if reason.code == ErrorCode.NO_ERROR else logging.WARNING
        log.log(level, "session closed name=%s code=%s reason=%r", self.name, ErrorCode.describe(reason.code), reason.reason)
        for stream in list(self._streams.values()):
            stream._on_fail(reason)
        self._streams.clear()
        self._accept_send.close()
        # Streams handed out but never accepted by the application are closed with the channel.
        for event in self._pongs.values():
            event.set()
        self._handshake.set()
        self._goaway_event.set()
        self._closed_event.set()
        self._drained.unpark_all()
        self._slots.unpark_all()
        self._writer_wakeup.set()
        if self._cancel_scope is not None:
            self._cancel_scope.cancel()

    # ------------------------------------------------------------------ tasks

    async def _serve(self, task_status: trio.TaskStatus[Session]) -> None:
        """The session's one task while it is idle: the HELLO, then the reader, whose wait for
        bytes is bounded by the next timer due (the handshake's, then the keepalive's: a PING
        written from here, the keepalive timeout)."""
        conn = self.connection
        receive_before = getattr(self.transport, "receive_before", None) or self._receive_before
        no_hello = SessionClosedError("no HELLO from the peer in time", ErrorCode.PROTOCOL_ERROR)
        handshake_by = trio.current_time() + self.handshake_timeout
        await self._write_through(handshake_by, no_hello)  # the HELLO
        started = False
        pinged_at: float | None = None
        # A transport may write while it reads (an h2 connection's own answers, a WebSocket's
        # pong): if such a write never completes, ``bound`` ends the session, as the keepalive
        # timer did when it ran in a task of its own: at the handshake timeout, then between one
        # and two keepalive timeouts after the last bytes read (moved rarely: moving it costs).
        now = 0.0  # the clock, read again at the top of the loop unless bytes were just read
        with trio.CancelScope(deadline=handshake_by) as bound:
            while not self.closed:
                if now <= 0.0:
                    now = trio.current_time()
                if started:
                    idle = now - self._last_received
                    if idle >= self.keepalive_timeout:
                        self._call_quiet(conn.goaway, ErrorCode.KEEPALIVE_TIMEOUT, "keepalive timeout")
                        with trio.move_on_after(1.0, shield=True):
                            await self._flush()
                        self._shutdown(SessionClosedError(
                            f"no data from peer for {idle:.1f}s (keepalive timeout)", ErrorCode.KEEPALIVE_TIMEOUT))
                        break
                    if idle >= self._ping_after and (pinged_at is None or pinged_at <= self._last_received):
                        self._call_quiet(conn.ping, now)
                        pinged_at = now
                        await self._write_through(*self._keepalive_deadline())
                        now = 0.0
                        continue
                    wake = self._last_received + self.keepalive_timeout
                    if bound.deadline < wake:  # moved rarely (a deadline moved costs): with slack
                        bound.deadline = wake + self.keepalive_timeout
                    if pinged_at is None or pinged_at <= self._last_received:
                        wake = min(wake, self._last_received + self._ping_after)
                    else:  # look again an interval after the PING (its PONG sets when the next one
                        # is due), or, that moment passed without a PONG, an interval from now
                        again = pinged_at + self._ping_after
                        wake = min(wake, again if again > now else now + self._ping_after)
                elif self._handshake.is_set():  # (also set by a shutdown: the loop ends then)
                    if self.closed:
                        break
                    bound.deadline = math.inf
                    # A first ping gives the flow-control auto-tuning its round-trip time.
                    self._call_quiet(conn.ping, now)
                    await self._write_through(*self._keepalive_deadline())
                    if self.closed:
                        break
                    started = self._started = True
                    task_status.started(self)
                    now = 0.0
                    continue
                elif now >= handshake_by:
                    self._shutdown(no_hello)
                    break
                else:
                    wake = handshake_by
                # Stop reading from a peer that does not read what we owe it (pongs, window updates).
                if conn.outbound_size >= self._high_water and self._writes_failed is None:
                    with trio.move_on_at(wake):
                        try:
                            await self._wait_outbound_room()
                        except SessionClosedError:
                            break
                    now = 0.0
                    continue
                try:
                    data = await receive_before(wake, _RECEIVE_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    self._shutdown(self._transport_failed(exc))
                    break
                now = 0.0
                if data is None:
                    continue  # a timer is due
                if not data:
                    reason = "peer closed the connection"
                    if conn.goaway_received is not None:
                        reason += f" after GOAWAY ({ErrorCode.describe(conn.goaway_received.code)})"
                    self._shutdown(SessionClosedError(reason))
                    break
                self._last_received = now = trio.current_time()
                try:
                    events = conn.receive_data(data, now)
                except RemoteProtocolError as exc:
                    log.warning("protocol error from peer name=%s code=%s error=%r", self.name, exc.code.name, exc.message)
                    with trio.move_on_after(_CLOSE_TIMEOUT, shield=True):
                        await self._flush()  # the GOAWAY that names the error
                    self._shutdown(SessionClosedError(f"peer broke the protocol: {exc.message}", exc.code))
                    break
                for event in events:
                    self._dispatch(event)
                # Only after the whole batch: a stream may close within it, after events still to deliver.
                for event in events:
                    stream_id: int | None = getattr(event, "stream_id", None)
                    if stream_id is not None and conn.stream_state(stream_id) is StreamState.CLOSED:
                        self._forget(stream_id)
                if not conn.outbound_size:
                    continue
                if self._streams:
                    # Not while streams run: a reader blocked in a write stops reading, and two peers
                    # whose readers both wait on full sockets would wait for ever.
                    self._wake_writer()
                else:
                    # An idle session's answers (a PONG above all) go out from here: no other task wakes.
                    # This task is the session's timer too, and the write is shielded: a peer that
                    # sends and never reads must not hold it past the timer (the keepalive timeout).
                    if started:
                        await self._write_through(*self._keepalive_deadline())
                    else:
                        await self._write_through(handshake_by, no_hello)
        if bound.cancelled_caught and not self.closed:  # a transport's write never completed
            self._shutdown(no_hello if not started else SessionClosedError(
                f"no data from peer for {self.keepalive_timeout:.1f}s (keepalive timeout)", ErrorCode.KEEPALIVE_TIMEOUT))

    async def _receive_before(self, deadline: float, max_bytes: int) -> bytes | bytearray | None:
        """A transport with no ``receive_before`` of its own (a plain byte stream, whose
        ``receive_some`` loses nothing when cancelled while it waits)."""
        with trio.move_on_at(deadline):
            return await self.transport.receive_some(max_bytes)
        return None

    async def _writer(self) -> None:
        """Hand the core's frames to the transport when the task that queued them could not (a write
        was in progress, or it cannot wait). Once the session is torn down (cancelled, or
        ``_shutdown``), it still writes what was queued before it stops — the last DATA and
        END_STREAM of streams that finished, the GOAWAY — within ``_CLOSE_TIMEOUT``: a frame is only
        lost with a transport that cannot take it. It stops at its next wait for more."""
        conn = self.connection
        while True:
            if self._writes_failed is not None:
                await self._read_what_is_left(self._writes_failed)
                return
            if self._writing or not conn.outbound_size:
                if not self._writing:
                    self._drained.unpark_all()
                await self._writer_wakeup.wait()
                self._writer_wakeup = trio.Event()
                continue
            if not await self._write_out() and self._writes_failed is None:
                return

    async def _write_through(self, deadline: float = math.inf, late: SessionClosedError | None = None) -> None:
        """Write what is queued in the calling task when no write is in progress (no task switch),
        and what is queued meanwhile; otherwise leave it to the write in progress (the writer task's
        or another's ``_write_through``: each goes on until nothing is left). One write at a time, in
        the order queued; shielded as the writer's, within the same close-time bound.

        The task that keeps the session's deadlines (handshake, keepalive) must not wait past them
        in a write: it gives ``deadline``, past which the session ends with ``late``."""
        if self._writes_failed is not None or self.closed:
            self._wake_writer()
            return
        if self._writing:
            return  # the write in progress takes these too: each writer goes on until none is left
        while self.connection.outbound_size and not self._writing:
            if not await self._write_out(deadline, late):
                return

    async def _write_out(self, deadline: float = math.inf, late: SessionClosedError | None = None) -> bool:
        """Write everything queued (the caller saw no write in progress), in writes of about
        ``_WRITE_SIZE``; False once the session writes no more (the transport failed: the writer
        task then reads what is left; or the close-time bound or ``deadline`` passed)."""
        conn = self.connection
        left = conn.outbound_size
        if not left:
            return True
        self._writing = True
        with trio.CancelScope(shield=True, deadline=min(deadline, self._last_write_by)) as sending:
            self._send_scope = sending
            try:
                while left > 0:
                    data = conn.data_to_send(_WRITE_SIZE)
                    if not data:
                        break
                    left -= len(data)
                    await self.transport.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self._writes_failed = self._transport_failed(exc)
            finally:
                self._writing = False
                self._send_scope = None
        if self._writes_failed is not None:
            self._start_writer()
            self._writer_wakeup.set()  # the writer task reads what is left
            return False
        if sending.cancelled_caught:  # torn down, and the peer did not take the frames in time
            if late is not None and deadline < self._last_write_by:
                self._shutdown(late)
            else:
                self._shutdown(SessionClosedError("transport took no more frames at close", ErrorCode.INTERNAL_ERROR))
            return False
        self._drained.unpark_all()
        return True

    def _start_writer(self) -> None:
        if not self._writer_started and self._nursery is not None:
            try:
                self._nursery.start_soon(self._writer)
            except RuntimeError:  # its tasks are all over (the session ended): nothing is written now
                self._nursery = None
                return
            self._writer_started = True

    async def _read_what_is_left(self, failed: SessionClosedError) -> None:
        """The transport took no more writes: the peer closed (a tunnel moved, a restart) as we
        wrote. What it sent before closing may still wait to be read — the end of a response whose
        stream it finished — so the reader goes on until the end of the transport (whose reason
        then closes the session), for at most a moment; then what is left fails with ``failed``.
        Meanwhile nothing new is sent: streams' sends and new streams fail at once."""
        self._drained.unpark_all()
        self._slots.unpark_all()
        for stream in list(self._streams.values()):
            stream._lot.unpark_all()
        with trio.move_on_after(_READ_AFTER_WRITES_FAILED):
            await self._closed_event.wait()
        self._shutdown(failed)

    def _cut_writes(self, when: float) -> None:
        self._last_write_by = min(self._last_write_by, when)
        if self._send_scope is not None:
            self._send_scope.deadline = self._last_write_by

    def _keepalive_deadline(self) -> tuple[float, SessionClosedError]:
        """When, and why, the session ends if a PING cannot be written (the peer neither reads nor
        sends: the keepalive timeout, as if nothing were written)."""
        return self._last_received + self.keepalive_timeout, SessionClosedError(
            f"no data from peer for {self.keepalive_timeout:.1f}s (keepalive timeout)", ErrorCode.KEEPALIVE_TIMEOUT)

    # ------------------------------------------------------------------ helpers

    def _dispatch(self, event: Event) -> None:
        match event:
            case DataReceived(stream_id=sid, data=data):
                stream = self._streams.get(sid)
                if stream is not None:
                    stream._on_data(data)
            case StreamOpened(stream_id=sid, metadata=metadata):
                stream = MuxStream(self, sid, metadata, local=False)
                if self._on_stream is not None:
                    self._hand_over(stream)
                    return
                try:
                    self._accept_send.send_nowait(stream)
                except trio.WouldBlock:
                    self.connection.refuse_stream(sid, ErrorCode.REFUSED_STREAM, "accept backlog full")
                    log.warning("refused stream name=%s stream=%d reason=backlog-full", self.name, sid)
                    return
                self._streams[sid] = stream
            case StreamAccepted(stream_id=sid, metadata=metadata):
                stream = self._streams.get(sid)
                if stream is not None:
                    stream.accept_metadata = metadata
                    stream._accepted.set()
            case StreamRefused(stream_id=sid, code=code, message=message):
                stream = self._streams.get(sid)
                if stream is not None:
                    stream._on_fail(StreamRefusedError(code, message))
            case StreamEnded(stream_id=sid):
                stream = self._streams.get(sid)
                if stream is not None:
                    stream._eof = True
                    stream._lot.unpark_all()
            case StreamReset(stream_id=sid, code=code, message=message, remote=remote):
                if not remote:
                    log.warning("reset stream name=%s stream=%d code=%s reason=%r", self.name, sid, ErrorCode.describe(code), message)
                stream = self._streams.get(sid)
                if stream is not None:
                    stream._on_fail(StreamResetError(code, message, remote=remote))
            case WindowUpdated(stream_id=sid):
                stream = self._streams.get(sid)
                if stream is not None:
                    stream._lot.unpark_all()
            case PongReceived(opaque=opaque):
                pong = self._pongs.get(opaque)
                if pong is not None:
                    pong.set()
            case GoAwayReceived(code=code, message=message):
                log.info("peer sent GOAWAY name=%s code=%s message=%r", self.name, ErrorCode.describe(code), message)
                self._goaway_event.set()
                self._slots.unpark_all()
            case NoticeReceived(metadata=metadata):
                if self._on_notice is not None:
                    self._notify(self._on_notice, metadata)
                else:
                    if self._early_notices is None:
                        self._early_notices = deque(maxlen=MAX_EARLY_NOTICES)
                    self._early_notices.append(metadata)
            case HandshakeCompleted(version=version):
                log.debug("handshake done name=%s version=%d.%d", self.name, *version)
                self._handshake.set()

    def _after_local_change(self, stream_id: int) -> None:
        self._wake_writer()
        if self.connection.stream_state(stream_id) is StreamState.CLOSED:
            self._forget(stream_id)

    def _forget(self, stream_id: int, *, wake: bool = True) -> None:
        if self._streams.pop(stream_id, None) is not None:
            self._slots.unpark_all()
        if wake:
            self._wake_writer()

    def _close_stream(self, stream: MuxStream) -> None:
        conn = self.connection
        sid = stream.stream_id
        state = conn.stream_state(sid)
        if state is StreamState.CLOSED or self.closed:
            self._forget(sid)
            return
        if state in (StreamState.OPEN_RECEIVED, StreamState.OPEN_RECEIVED_REMOTE_CLOSED):
            conn.refuse_stream(sid, ErrorCode.CANCEL, "closed before it was accepted")
        else:
            # Graceful for what we sent (the peer reads it, then EOF); "stop sending" for the rest.
            if not stream._eof_sent and state in (StreamState.OPEN_SENT, StreamState.OPEN, StreamState.HALF_CLOSED_REMOTE):
                conn.end_stream(sid)
            if conn.stream_state(sid) is not StreamState.CLOSED:
                conn.reset_stream(sid, ErrorCode.CANCEL, "stream closed")
        self._forget(sid)

    def _acknowledge(self, stream_id: int, size: int) -> None:
        self.connection.acknowledge_received_data(stream_id, size, trio.current_time())
        if self.connection.outbound_size:
            self._wake_writer()

    def _call(self, method: Any, *args: Any) -> Any:
        """Call into the mux core, turning its errors into the stream errors Trio code expects."""
        self._raise_if_closed()
        try:
            return method(*args)
        except LocalProtocolError as exc:
            raise trio.BrokenResourceError(str(exc)) from exc

    def _call_quiet(self, method: Any, *args: Any) -> None:
        try:
            method(*args)
        except LocalProtocolError:
            pass

    def _wake_writer(self) -> None:
        if self.connection.outbound_size:  # a wakeup with nothing to send costs a task switch
            self._start_writer()
            self._writer_wakeup.set()

    async def _wait_outbound_room(self) -> None:
        while (self.connection.outbound_size >= self._high_water and not self.closed
               and self._writes_failed is None):
            self._wake_writer()
            await self._drained.park()
        self._raise_if_closed()

    def _raise_if_unwritable(self) -> None:
        """Sending, or opening a stream, once the transport took no more writes."""
        self._raise_if_closed()
        if self._writes_failed is not None:
            raise self._writes_failed

    async def _flush(self) -> None:
        """Wait until everything queued so far has been handed to the transport."""
        self._wake_writer()
        while (self.connection.outbound_size or self._writing) and not self.closed and self._writes_failed is None:
            await self._drained.park()


async def connect_session(nursery: trio.Nursery, transport: trio.abc.Stream, *, client: bool, **kwargs: Any) -> Session:
    """Start a session in ``nursery``; returns once the handshake is done (or raises why not)."""
    session = Session(transport, client=client, **kwargs)
    started: Session = await nursery.start(session.run)
    return started


@asynccontextmanager
async def open_session(
    transport: trio.abc.Stream,
    *,
    client: bool,
    **kwargs: Any,
) -> AsyncIterator[Session]:
    """``async with open_session(stream, client=True) as session:`` — closed (GOAWAY) on exit.

    A handshake failure raises SessionClosedError as itself, not wrapped in an exception group.
    """
    session = Session(transport, client=client, **kwargs)
    failure: SessionClosedError | None = None
    async with trio.open_nursery() as nursery:
        try:
            await nursery.start(session.run)
        except SessionClosedError as exc:
            failure = exc
            nursery.cancel_scope.cancel()
        if failure is None:
            try:
                yield session
            finally:
                await session.aclose()
                nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure
