"""The stream multiplexer: a sans-I/O connection object in the style of ``h2.connection``.

``receive_data(bytes, now) -> [events]`` and ``data_to_send() -> bytes``; every other method queues
frames. It never touches a socket or a clock (``now`` is an argument). Peer mistakes limited to one
stream reset that stream (an event with ``remote=False`` says so); anything else raises
``RemoteProtocolError`` after queueing a GOAWAY, and the error is sticky.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator

import attrs

from wire import codec
from wire.errors import ErrorCode, LocalProtocolError, ProtocolError, RemoteProtocolError
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
from wire.flow import ReceiveWindow
from wire.frames import (
    Accept,
    Data,
    Frame,
    GoAway,
    HalfClose,
    Hello,
    Metadata,
    Notice,
    Open,
    Ping,
    Pong,
    Refuse,
    Reset,
    WindowUpdate,
)
from wire.settings import MAX_WINDOW_LIMIT, NOTICE_VERSION, PROTOCOL_VERSION, Limits, Settings
from wire.streamstate import LOCAL_OPEN, REMOTE_OPEN, StreamInput, StreamState, next_state

_MAX_OUTSTANDING_PINGS = 16
#: longest RESET/REFUSE/GOAWAY message sent, in UTF-8 bytes (longer ones are cut, never refused:
#: they are written on error paths that must not fail)
_MAX_MESSAGE_BYTES = 1024
_MAX_CODE = 2**32 - 1


class ConnectionState(enum.Enum):
    AWAITING_HELLO = "awaiting-hello"
    OPEN = "open"
    FAILED = "failed"


@attrs.define(kw_only=True)
class _Stream:
    state: StreamState
    local: bool
    send_window: int
    recv: ReceiveWindow
    bytes_sent: int = 0
    bytes_received: int = 0


@attrs.frozen(kw_only=True)
class StreamInfo:
    """A snapshot of one stream, for statistics."""

    stream_id: int
    state: StreamState
    local: bool
    send_window: int
    recv_window: int
    buffered: int
    bytes_sent: int
    bytes_received: int


class MuxConnection:
    """One side of a multiplexed session. ``client`` is the side that dialed: it opens odd ids."""

    def __init__(
        self,
        *,
        client: bool,
        settings: Settings | None = None,
        limits: Limits | None = None,
        metadata: Metadata | None = None,
    ) -> None:
        self.client = client
        self.local_settings = settings or Settings()
        self.limits = limits or Limits(max_frame_payload=self.local_settings.max_frame_payload)
        if self.limits.max_frame_payload < self.local_settings.max_frame_payload:
            raise ValueError("limits.max_frame_payload is below the announced settings.max_frame_payload")
        self.local_metadata: Metadata = dict(metadata or {})
        self.peer_settings: Settings | None = None
        self.peer_metadata: Metadata = {}
        self.version: tuple[int, int] | None = None
        self.state = ConnectionState.AWAITING_HELLO
        self.error: RemoteProtocolError | None = None
        self.rtt: float | None = None
        self.goaway_sent: GoAway | None = None
        self.goaway_received: GoAway | None = None
        self.bytes_sent = 0
        self.bytes_received = 0
        self.streams_refused = 0
        self._decoder = codec.FrameDecoder(self.limits)
        self._outbound: list[bytes | memoryview] = []
        self._outbound_size = 0
        self._streams: dict[int, _Stream] = {}
        # How many of ``_streams`` this side opened: each OPEN checks a limit against it, and
        # counting the table each time cost a pass over every stream per stream opened.
        self._local_count = 0
        self._next_local_id = 1 if client else 2
        self._last_peer_id = 0
        self._pings: dict[int, float | None] = {}
        self._next_ping = 1
        self._hello_sent = False

    # ------------------------------------------------------------------ output

    def initiate(self) -> None:
        """Queue this side's HELLO. Call once, before anything else is sent."""
        if self._hello_sent:
            raise LocalProtocolError("HELLO already sent")
        major, minor = PROTOCOL_VERSION
        self._queue_checked(
            Hello(major=major, minor=minor, settings=self.local_settings.to_wire(), metadata=self.local_metadata)
        )
        self._hello_sent = True

    def data_to_send(self, max_bytes: int | None = None) -> bytes:
        """What is queued, oldest first, and forget it: everything, or with ``max_bytes`` the
        queued pieces (whole frames, or a DATA frame's header or payload) up to about that many
        bytes — at least one piece, past ``max_bytes`` only by the last one taken. A writer that
        takes its bytes this way keeps each write small enough to stay in the CPU cache: one
        large join costs more, per byte, than the several writes it saves (measured)."""
        outbound = self._outbound
        if not outbound:
            return b""
        count = len(outbound)
        size = self._outbound_size
        if max_bytes is not None and size > max_bytes:
            size = count = 0
            while size < max_bytes:
                size += len(outbound[count])
                count += 1
        first = outbound[0]
        data = first if count == 1 and isinstance(first, bytes) else b"".join(outbound[:count])
        if count == len(outbound):
            outbound.clear()
        else:
            del outbound[:count]
        self._outbound_size -= size
        return data

    @property
    def outbound_size(self) -> int:
        """Bytes queued and not yet taken by ``data_to_send`` (for writer backpressure)."""
        return self._outbound_size

    def _queue(self, frame: Frame) -> None:
        self._queue_bytes(codec.encode(frame))

    def _queue_checked(self, frame: Frame) -> None:
        """Queue a frame carrying caller data; LocalProtocolError (nothing queued) if it is invalid."""
        self._queue_bytes(codec.encode_checked(frame, self.limits))

    def _queue_bytes(self, data: bytes | memoryview) -> None:
        self._outbound.append(data)
        self._outbound_size += len(data)
        self.bytes_sent += len(data)

    # ------------------------------------------------------------------ local API

    def _require_hello_sent(self) -> None:
        # HELLO must be the first frame on the wire; anything queued before it would be a protocol
        # error at the peer.
        if not self._hello_sent:
            raise LocalProtocolError("call initiate() first: HELLO must be the first frame sent")

    def _require_open(self) -> Settings:
        if self.state is ConnectionState.FAILED:
            raise LocalProtocolError(f"session failed: {self.error}", ErrorCode.PROTOCOL_ERROR)
        self._require_hello_sent()
        if self.peer_settings is None:
            raise LocalProtocolError("handshake not complete", ErrorCode.PROTOCOL_ERROR)
        return self.peer_settings

    def _local_stream(self, stream_id: int, event: StreamInput) -> tuple[_Stream, StreamState]:
        """The stream and its state after ``event``; the caller commits the state once it queued."""
        if self.state is ConnectionState.FAILED:
            raise LocalProtocolError(f"session failed: {self.error}", ErrorCode.PROTOCOL_ERROR)
        stream = self._streams.get(stream_id)
        if stream is None:
            raise LocalProtocolError(f"stream {stream_id} is closed", ErrorCode.STREAM_CLOSED)
        new = next_state(stream.state, event)
        if new is None:
            raise LocalProtocolError(
                f"cannot {event.value} on stream {stream_id} in state {stream.state.value}",
                ErrorCode.STREAM_CLOSED,
            )
        return stream, new

    def _settle(self, stream_id: int, stream: _Stream, new: StreamState | None = None) -> None:
        if new is not None:
            stream.state = new
        if stream.state is StreamState.CLOSED:
            self._untrack(stream_id, stream)

    def _untrack(self, stream_id: int, stream: _Stream) -> None:
        del self._streams[stream_id]
        if stream.local:
            self._local_count -= 1

    def can_open_stream(self) -> bool:
        """Whether ``open_stream`` would succeed now (else wait for a stream to close)."""
        if self.peer_settings is None or self.goaway_received or self.goaway_sent:
            return False
        return self.local_stream_count < self.peer_settings.max_concurrent_streams

    def open_stream(self, metadata: Metadata | None = None) -> int:
        peer = self._require_open()
        if self.goaway_received is not None:
            raise LocalProtocolError("peer is draining (GOAWAY received)", ErrorCode.REFUSED_STREAM)
        if self.goaway_sent is not None:
            raise LocalProtocolError("this side is draining (GOAWAY sent)", ErrorCode.REFUSED_STREAM)
        if self.local_stream_count >= peer.max_concurrent_streams:
            raise LocalProtocolError(
                f"peer allows {peer.max_concurrent_streams} concurrent streams", ErrorCode.LIMIT_EXCEEDED
            )
        stream_id = self._next_local_id
        if stream_id > codec.MAX_STREAM_ID:
            raise LocalProtocolError("stream ids exhausted; open a new session", ErrorCode.LIMIT_EXCEEDED)
        self._queue_checked(Open(stream_id=stream_id, metadata=dict(metadata or {})))
        self._next_local_id += 2
        self._local_count += 1
        self._streams[stream_id] = _Stream(
            state=StreamState.OPEN_SENT,
            local=True,
            send_window=peer.initial_window,
            recv=self._new_receive_window(),
        )
        return stream_id

    def _new_receive_window(self) -> ReceiveWindow:
        return ReceiveWindow(window=self.local_settings.initial_window, max_window=self.local_settings.max_window)

    def accept_stream(self, stream_id: int, metadata: Metadata | None = None) -> None:
        stream, new = self._local_stream(stream_id, StreamInput.SEND_ACCEPT)
        self._queue_checked(Accept(stream_id=stream_id, metadata=dict(metadata or {})))
        self._settle(stream_id, stream, new)

    def refuse_stream(self, stream_id: int, code: int = ErrorCode.REFUSED_STREAM, message: str = "") -> None:
        stream, new = self._local_stream(stream_id, StreamInput.SEND_REFUSE)
        self._queue(Refuse(stream_id=stream_id, code=_check_code(code), message=_clip(message)))
        self._settle(stream_id, stream, new)

    def send_window(self, stream_id: int) -> int:
        """Bytes ``send_data`` would take now on this stream (0 when closed for sending)."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.state not in LOCAL_OPEN:
            return 0
        return stream.send_window

    def send_data(self, stream_id: int, data: bytes | bytearray | memoryview) -> int:
        """Queue as much of ``data`` as the stream's credit allows; return how many bytes that was."""
        stream, _ = self._local_stream(stream_id, StreamInput.SEND_DATA)
        assert self.peer_settings is not None
        view = codec.byte_view(data)
        size = min(len(view), stream.send_window)
        if size == 0:
            return 0
        step = self.peer_settings.max_frame_payload
        # An immutable payload is queued as views into it (one copy, when the output is joined);
        # a mutable one is copied now, since the caller may reuse its buffer once this returns.
        source = view if type(view.obj) is bytes else None
        for start in range(0, size, step):
            stop = min(start + step, size)
            self._queue_bytes(codec.data_header(stream_id, stop - start))
            self._queue_bytes(source[start:stop] if source is not None else bytes(view[start:stop]))
        stream.send_window -= size
        stream.bytes_sent += size
        return size

    def end_stream(self, stream_id: int) -> None:
        """Half-close: this side sends no more data on the stream."""
        stream, new = self._local_stream(stream_id, StreamInput.SEND_HALF_CLOSE)
        self._queue(HalfClose(stream_id=stream_id))
        self._settle(stream_id, stream, new)

    def reset_stream(self, stream_id: int, code: int = ErrorCode.CANCEL, message: str = "") -> None:
        """Abort the stream. A no-op when it is already closed (both sides may race to reset)."""
        code = _check_code(code)
        if stream_id not in self._streams or self.state is ConnectionState.FAILED:
            return
        stream, new = self._local_stream(stream_id, StreamInput.SEND_RESET)
        self._queue(Reset(stream_id=stream_id, code=code, message=_clip(message)))
        self._settle(stream_id, stream, new)

    def acknowledge_received_data(self, stream_id: int, size: int, now: float = 0.0) -> None:
        """The application consumed ``size`` bytes: return credit to the peer when it is due."""
        stream = self._streams.get(stream_id)
        if stream is None or self.state is ConnectionState.FAILED:
            return
        try:
            increment = stream.recv.on_consumed(size, now, self.rtt)
        except ValueError as exc:
            raise LocalProtocolError(f"stream {stream_id}: {exc}") from None
        if increment and stream.state in REMOTE_OPEN:
            self._queue(WindowUpdate(stream_id=stream_id, increment=increment))

    def ping(self, now: float | None = None) -> int:
        """Queue a PING; its PONG reports the round-trip time when ``now`` is given."""
        if self.state is ConnectionState.FAILED:
            raise LocalProtocolError(f"session failed: {self.error}")
        self._require_hello_sent()
        opaque = self._next_ping
        self._next_ping = (self._next_ping + 1) % codec.MAX_OPAQUE or 1
        if len(self._pings) >= _MAX_OUTSTANDING_PINGS:
            del self._pings[next(iter(self._pings))]
        self._pings[opaque] = now
        self._queue(Ping(opaque=opaque))
        return opaque

    def notice(self, metadata: Metadata) -> bool:
        """Queue a NOTICE if the peer understands it (its HELLO said 1.1 or later); False if not
        (nothing is queued: an older peer would fail the session on an unknown frame kind).
        ``UnsendableFrameError`` for metadata over the limits."""
        if self.state is ConnectionState.FAILED:
            raise LocalProtocolError(f"session failed: {self.error}")
        if self.version is None or self.version < NOTICE_VERSION:
            return False
        self._queue_checked(Notice(metadata=dict(metadata)))
        return True

    def goaway(self, code: int = ErrorCode.NO_ERROR, message: str = "") -> None:
        """Start draining: the peer may open no new streams; in-flight ones finish."""
        code = _check_code(code)
        if self.state is ConnectionState.FAILED:
            return  # the GOAWAY naming the error is already queued; nothing follows it
        if self.goaway_sent is not None and code == ErrorCode.NO_ERROR:
            return
        frame = GoAway(last_stream_id=self._last_peer_id, code=code, message=_clip(message))
        self.goaway_sent = frame
        self._queue(frame)

    # ------------------------------------------------------------------ introspection

    @property
    def local_stream_count(self) -> int:
        return self._local_count

    @property
    def peer_stream_count(self) -> int:
        return len(self._streams) - self._local_count

    @property
    def open_stream_ids(self) -> list[int]:
        return list(self._streams)

    def stream_state(self, stream_id: int) -> StreamState:
        """The state of a stream; CLOSED for any id no longer (or never) tracked."""
        stream = self._streams.get(stream_id)
        return StreamState.CLOSED if stream is None else stream.state

    def stream_info(self, stream_id: int) -> StreamInfo | None:
        stream = self._streams.get(stream_id)
        if stream is None:
            return None
        return StreamInfo(
            stream_id=stream_id,
            state=stream.state,
            local=stream.local,
            send_window=stream.send_window,
            recv_window=stream.recv.window,
            buffered=stream.recv.buffered,
            bytes_sent=stream.bytes_sent,
            bytes_received=stream.bytes_received,
        )

    def streams(self) -> Iterator[StreamInfo]:
        for stream_id in list(self._streams):
            info = self.stream_info(stream_id)
            if info is not None:
                yield info

    # ------------------------------------------------------------------ input

    def receive_data(self, data: bytes | bytearray | memoryview, now: float = 0.0) -> list[Event]:
        """Feed bytes from the peer; return what happened. Raises RemoteProtocolError (sticky)."""
        if self.error is not None:
            raise self.error
        self._require_hello_sent()  # replies (PONG, REFUSE, RESET) must not precede our HELLO
        self.bytes_received += len(data)
        events: list[Event] = []
        try:
            for frame in self._decoder.feed(data):
                self._receive_frame(frame, now, events)
        except RemoteProtocolError as exc:
            self._fail(exc)
            raise
        return events

    def _fail(self, exc: RemoteProtocolError) -> None:
        self.error = exc
        if self.state is not ConnectionState.FAILED:
            self.state = ConnectionState.FAILED
            frame = GoAway(last_stream_id=self._last_peer_id, code=exc.code, message=_clip(exc.message))
            self.goaway_sent = frame
            self._queue(frame)
        self._streams.clear()
        self._local_count = 0

    def _receive_frame(self, frame: Frame, now: float, events: list[Event]) -> None:
        if self.state is ConnectionState.AWAITING_HELLO:
            if type(frame) is GoAway:
                # A peer may turn this side away before its HELLO (bad token, overloaded …).
                self._receive_goaway(frame, events)
                return
            if type(frame) is not Hello:
                raise RemoteProtocolError(f"expected HELLO first, got {frame.kind.name}")
            self._receive_hello(frame, events)
            return
        match frame:
            case Data():
                self._receive_data_frame(frame, events)
            case WindowUpdate():
                self._receive_window_update(frame, events)
            case Open():
                self._receive_open(frame, events)
            case Accept():
                stream = self._peer_frame_stream(frame.stream_id, StreamInput.RECV_ACCEPT, events)
                if stream is not None:
                    events.append(StreamAccepted(stream_id=frame.stream_id, metadata=frame.metadata))
            case Refuse():
                stream = self._peer_frame_stream(frame.stream_id, StreamInput.RECV_REFUSE, events)
                if stream is not None:
                    events.append(StreamRefused(stream_id=frame.stream_id, code=frame.code, message=frame.message))
            case HalfClose():
                stream = self._peer_frame_stream(frame.stream_id, StreamInput.RECV_HALF_CLOSE, events)
                if stream is not None:
                    events.append(StreamEnded(stream_id=frame.stream_id))
            case Reset():
                stream = self._peer_frame_stream(frame.stream_id, StreamInput.RECV_RESET, events)
                if stream is not None:
                    events.append(
                        StreamReset(stream_id=frame.stream_id, code=frame.code, message=frame.message, remote=True)
                    )
            case Ping():
                self._queue(Pong(opaque=frame.opaque))
            case Pong():
                sent = self._pings.pop(frame.opaque, None)
                rtt = None if sent is None else max(0.0, now - sent)
                if rtt is not None:
                    self.rtt = rtt
                events.append(PongReceived(opaque=frame.opaque, rtt=rtt))
            case GoAway():
                self._receive_goaway(frame, events)
            case Notice():
                events.append(NoticeReceived(metadata=frame.metadata))
            case Hello():
                raise RemoteProtocolError("second HELLO")

    def _receive_hello(self, frame: Hello, events: list[Event]) -> None:
        major, minor = PROTOCOL_VERSION
        if frame.major != major:
            raise RemoteProtocolError(
                f"peer speaks protocol {frame.major}.{frame.minor}; this side speaks {major}.{minor}",
                ErrorCode.UNSUPPORTED_VERSION,
            )
        self.peer_settings = Settings.from_wire(frame.settings)
        self.peer_metadata = frame.metadata
        self.version = (major, min(minor, frame.minor))
        self.state = ConnectionState.OPEN
        events.append(HandshakeCompleted(version=self.version, peer_metadata=frame.metadata))

    def _is_local_id(self, stream_id: int) -> bool:
        return (stream_id % 2 == 1) == self.client

    def _peer_frame_stream(self, stream_id: int, event: StreamInput, events: list[Event]) -> _Stream | None:
        """Apply ``event`` to a stream; None when the frame is to be ignored or reset the stream."""
        stream = self._streams.get(stream_id)
        if stream is None:
            self._check_closed_id(stream_id, event.value)
            return None  # closed already: frames in flight when it closed are harmless
        new = next_state(stream.state, event)
        if new is None:
            if event in (StreamInput.RECV_ACCEPT, StreamInput.RECV_REFUSE) and not stream.local:
                raise RemoteProtocolError(f"{event.value} on stream {stream_id}, which the peer itself opened")
            self._stream_error(
                stream_id, ErrorCode.STREAM_CLOSED, f"{event.value} in state {stream.state.value}", events
            )
            return None
        stream.state = new
        self._settle(stream_id, stream)
        return stream

    def _check_closed_id(self, stream_id: int, what: str) -> None:
        """A frame names an untracked stream: fine if it existed once, a protocol error if never."""
        if self._is_local_id(stream_id):
            if stream_id >= self._next_local_id:
                raise RemoteProtocolError(f"{what} on stream {stream_id}, which this side never opened")
        elif stream_id > self._last_peer_id:
            raise RemoteProtocolError(f"{what} on stream {stream_id}, which the peer never opened")

    def _stream_error(self, stream_id: int, code: ErrorCode, message: str, events: list[Event]) -> None:
        self.reset_stream(stream_id, code, message)
        events.append(StreamReset(stream_id=stream_id, code=code, message=message, remote=False))

    def _receive_open(self, frame: Open, events: list[Event]) -> None:
        stream_id = frame.stream_id
        if self._is_local_id(stream_id):
            raise RemoteProtocolError(f"peer opened stream {stream_id}, an id of this side's parity")
        if stream_id <= self._last_peer_id:
            raise RemoteProtocolError(f"peer reused or went back to stream id {stream_id}")
        self._last_peer_id = stream_id
        if self.goaway_sent is not None:
            self.streams_refused += 1
            self._queue(Refuse(stream_id=stream_id, code=ErrorCode.REFUSED_STREAM, message="draining"))
            return
        if self.peer_stream_count >= self.local_settings.max_concurrent_streams:
            self.streams_refused += 1
            self._queue(
                Refuse(
                    stream_id=stream_id,
                    code=ErrorCode.REFUSED_STREAM,
                    message=f"more than {self.local_settings.max_concurrent_streams} concurrent streams",
                )
            )
            return
        assert self.peer_settings is not None
        self._streams[stream_id] = _Stream(
            state=StreamState.OPEN_RECEIVED,
            local=False,
            send_window=self.peer_settings.initial_window,
            recv=self._new_receive_window(),
        )
        events.append(StreamOpened(stream_id=stream_id, metadata=frame.metadata))

    def _receive_data_frame(self, frame: Data, events: list[Event]) -> None:
        stream_id = frame.stream_id
        stream = self._streams.get(stream_id)
        if stream is not None and stream.state in REMOTE_OPEN:
            try:
                stream.recv.on_data(len(frame.payload))
            except ProtocolError as exc:
                self._stream_error(stream_id, exc.code, exc.message, events)
                return
            stream.bytes_received += len(frame.payload)
            if frame.payload:
                events.append(DataReceived(stream_id=stream_id, data=frame.payload))
            return
        self._peer_frame_stream(stream_id, StreamInput.RECV_DATA, events)

    def _receive_window_update(self, frame: WindowUpdate, events: list[Event]) -> None:
        stream_id = frame.stream_id
        stream = self._streams.get(stream_id)
        if stream is None:
            self._check_closed_id(stream_id, "window-update")
            return
        if stream.state not in _MAY_SEND:
            return  # we finished sending; a late update is harmless
        if stream.send_window + frame.increment > MAX_WINDOW_LIMIT:
            self._stream_error(stream_id, ErrorCode.FLOW_CONTROL_ERROR, "window grew past 2**31-1", events)
            return
        stream.send_window += frame.increment
        events.append(WindowUpdated(stream_id=stream_id, increment=frame.increment))

    def _receive_goaway(self, frame: GoAway, events: list[Event]) -> None:
        self.goaway_received = frame
        # Streams this side opened above last_stream_id were never processed: safe to retry elsewhere.
        for stream_id in [s for s, st in self._streams.items() if st.local and s > frame.last_stream_id]:
            self._untrack(stream_id, self._streams[stream_id])
            events.append(
                StreamRefused(stream_id=stream_id, code=ErrorCode.REFUSED_STREAM, message="not processed before GOAWAY")
            )
        events.append(GoAwayReceived(last_stream_id=frame.last_stream_id, code=frame.code, message=frame.message))


#: states in which this side may send DATA now or once it accepts: credit granted there counts
_MAY_SEND = LOCAL_OPEN | {StreamState.OPEN_RECEIVED, StreamState.OPEN_RECEIVED_REMOTE_CLOSED}


def _check_code(code: int) -> int:
    if not isinstance(code, int) or not 0 <= code <= _MAX_CODE:
        raise LocalProtocolError(f"error code must be an integer in 0..2**32-1, got {code!r:.40}")
    return int(code)


def _clip(message: str) -> str:
    """``message`` as valid UTF-8 of at most _MAX_MESSAGE_BYTES, cut on a character boundary."""
    return message.encode("utf-8", "replace")[:_MAX_MESSAGE_BYTES].decode("utf-8", "ignore")
