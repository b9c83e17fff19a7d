"""The one driver of h2 over Trio: an ``H2Connection`` over a ``trio.abc.Stream``, either side.

``H2Driver`` owns the connection: one reader (``run_reader``, or ``pump`` one read at a time while a
handshake is decided, or — ``reads_on_demand``, the tunnel's way, no task of its own — whoever
waits on the connection: ``H2Stream.read_data``, and a ``send_data`` waiting for the peer's window,
one at a time) that feeds h2 and dispatches its events, and one writer path (``flush``) that
moves what h2 queued to the stream in order, vectored where the stream can. Each HTTP/2 stream is an
``H2Stream``: its head, an inbound body queue acknowledged to the peer only as the consumer takes
the bytes (flow control *is* the backpressure, as in hypercorn), and ``send_data`` that sends at
most ``min(local_flow_control_window, max_outbound_frame_size)`` at a time and parks until a
WINDOW_UPDATE (or a SETTINGS change) opens the window. A peer's RST_STREAM fails that stream (and
cancels the scopes given to ``cancel_when_broken``); the connection's end (EOF, I/O error, a
protocol error, GOAWAY) fails every stream: a clean GOAWAY (NO_ERROR) reads as the end of each
stream's body, anything else as ``trio.BrokenResourceError``. Errors of this module are always
``trio.BrokenResourceError``/``ClosedResourceError``; h2's own exceptions do not escape.

Make the ``H2Connection`` with ``h2trio.lean.new_connection`` (the fast one, or h2's own under
KASD_SAFE_MODE) and hand it over fresh: the driver starts it (``initiate_connection``, then your
``settings`` and ``connection_window``), and settings changed later go through
``driver.update_settings`` (the driver must know which SETTINGS the peer has yet to acknowledge).

What a peer may cost is checked in front of h2 (``h2trio.budget``): every frame header is read as
the bytes arrive, and a frame longer than the MAX_FRAME_SIZE the peer has acknowledged ends the
connection with GOAWAY FRAME_SIZE_ERROR before its body is read, a header block (HEADERS +
CONTINUATION) beyond the advertised MAX_HEADER_LIST_SIZE (plus slack) with GOAWAY ENHANCE_YOUR_CALM.
Streams the peer resets before their answer began, and streams refused, spend a token bucket
(``reset_limit``); once it is empty: GOAWAY ENHANCE_YOUR_CALM (HTTP/2 rapid reset). ``on_request``
is called only once a whole read has been dispatched, for the streams not reset in it: a HEADERS +
RST_STREAM pair never starts a task. ``statistics()`` counts what was dropped.

A client (the tunnel carrier's dialing side)::

    driver = H2Driver(stream, conn, settings={...})
    h2s = await driver.open_stream([(":method", "POST"), (":path", "/tunnel"), ...])
    head = await h2s.receive_head()        # needs the reader: run_reader in a task, or pump()
    await h2s.send_data(b"..."); data = await h2s.receive_data()

A server front end with many concurrent requests (kasd's HTTP/2 proxy port)::

    conn = lean.new_connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
    driver = H2Driver(
        stream, conn, connection_window=16 << 20,
        settings={SettingCodes.MAX_CONCURRENT_STREAMS: 250, SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20},
    )
    async with trio.open_nursery() as nursery:
        driver.on_request = lambda h2s: nursery.start_soon(handle, h2s)   # None: refuse new streams
        with trio.CancelScope(deadline=...) as reading:   # idle/head timeouts are the caller's
            await driver.run_reader(initial=preface_already_read)
        # over: driver.close_reason says why, driver.protocol_error is set if the peer broke HTTP/2
    await driver.aclose()                                 # GOAWAY, then close the stream

    async def handle(h2s: H2Stream) -> None:
        with trio.CancelScope() as scope:
            h2s.cancel_when_broken(scope)                  # client RST_STREAM / connection gone
            method = dict(h2s.head)[b":method"]            # the request head, as h2 decoded it
            while data := await h2s.receive_data():        # b"" once the client ended its body
                ...
            await h2s.send_headers([(":status", "200"), ...])
            await h2s.send_data(body, end_stream=True)     # or end_stream() later
        if scope.cancelled_caught or failed:
            await h2s.reset(h2.errors.ErrorCodes.CANCEL)
        h2s.close()                                        # late DATA for it is acknowledged and dropped

``h2s.ended_by_peer`` (END_STREAM seen, body fully queued) tells a bodiless request at once.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import trio

from h2trio.budget import (
    DEFAULT_RESET_LIMIT,
    HEADER_BLOCK_SLACK,
    BudgetExceededError,
    FrameScanner,
    ResetBucket,
    ResetLimit,
)
from h2trio.lean import MalformedRequest, StreamErrors, data_to_send_chunks
from netio.fastio import send_many

__all__ = ["DriverStatistics", "H2Driver", "H2Stream", "Headers", "ResetLimit"]

#: headers as h2 takes and gives them (``str`` with a ``header_encoding``, else ``bytes``)
Headers = Sequence[tuple[Any, Any]]

_RECEIVE_SIZE = 256 * 1024
#: bytes queued behind a send in progress before a further flush() waits for it
_FLUSH_HIGH_WATER = 1 << 20
_MAX_FRAME_SIZE = h2.settings.SettingCodes.MAX_FRAME_SIZE
_MAX_HEADER_LIST_SIZE = h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE


@attrs.frozen(kw_only=True)
class DriverStatistics:
    """What a connection's peer started and dropped (see ``H2Driver.statistics``)."""

    #: request streams reset by the peer in the same read that opened them: never handed over
    streams_dropped: int
    #: request streams handed to ``on_request`` that the peer reset before the answer began
    streams_reset_unanswered: int
    #: request streams refused (REFUSED_STREAM)
    streams_refused: int


class H2Driver:
    """One HTTP/2 connection over ``stream``; see the module docstring."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        conn: h2.connection.H2Connection,
        *,
        settings: Mapping[h2.settings.SettingCodes | int, int] | None = None,
        connection_window: int | None = None,
        receive_size: int = _RECEIVE_SIZE,
        reset_limit: ResetLimit = DEFAULT_RESET_LIMIT,
        reset_bucket: ResetBucket | None = None,
    ) -> None:
        self.stream = stream
        self.conn = conn
        self.receive_size = receive_size
        #: open streams by id
        self.streams: dict[int, H2Stream] = {}
        #: called (synchronously, by the reader) with each new request stream; None refuses them
        self.on_request: Callable[[H2Stream], object] | None = None
        self.closed = False
        self.close_reason = ""
        #: what the peer got wrong, when the connection ended on an HTTP/2 protocol error (or went
        #: beyond a limit: a ``h2trio.budget.BudgetExceededError``, its ``error_code`` the GOAWAY's)
        self.protocol_error: h2.exceptions.ProtocolError | None = None
        self._queued: list[bytes] = []
        self._queued_bytes = 0
        self._sending = False
        self._drained = trio.lowlevel.ParkingLot()
        self._window_lot = trio.lowlevel.ParkingLot()
        #: no reader task: the connection is read by whoever waits on it (``H2Stream.read_data``,
        #: and a ``send_data`` waiting for the peer's window); set by the owner (the tunnel carrier)
        self.reads_on_demand = False
        #: a task is reading the stream (``run_reader``, or ``read_for``/a sender's ``_read_once``):
        #: no other may, and whoever waits for what the reader brings parks on ``_read_lot``
        self._reading = False
        self._reader_task = False
        self._read_lot = trio.lowlevel.ParkingLot()
        self.reset_limit = reset_limit
        #: the connection's own, or one shared by the connections of its source (``ResetBuckets``)
        self._resets = reset_bucket if reset_bucket is not None else ResetBucket(reset_limit, trio.current_time())
        #: request streams of the read being dispatched, handed over once it is all dispatched
        self._arrived: list[H2Stream] = []
        self._dropped = 0
        self._reset_unanswered = 0
        self._refused = 0
        header_list = conn.local_settings.max_header_list_size or h2.connection.H2Connection.DEFAULT_MAX_HEADER_LIST_SIZE
        self._scanner = FrameScanner(
            server=not conn.config.client_side, header_block_limit=header_list + HEADER_BLOCK_SLACK
        )
        if isinstance(conn, StreamErrors):
            conn.malformed_allowed = self._malformed_allowed  # type: ignore[method-assign]
        conn.initiate_connection()
        self._scanner.settings_sent(conn.local_settings.max_frame_size)
        if settings:
            self.update_settings(settings)
        if connection_window is not None and connection_window > 65535:
            conn.increment_flow_control_window(connection_window - 65535)

    def update_settings(self, settings: Mapping[h2.settings.SettingCodes | int, int]) -> None:
        """Queue a SETTINGS frame (sent with the next flush). A larger MAX_FRAME_SIZE applies to
        what the peer sends once it acknowledged the frame; a MAX_HEADER_LIST_SIZE at once."""
        self.conn.update_settings(dict(settings))
        self._scanner.settings_sent(settings.get(_MAX_FRAME_SIZE))
        if (header_list := settings.get(_MAX_HEADER_LIST_SIZE)) is not None:
            self._scanner.header_block_limit = header_list + HEADER_BLOCK_SLACK

    @property
    def _settings_unacknowledged(self) -> int:
        """SETTINGS frames sent that the peer has yet to acknowledge."""
        return self._scanner.settings_unacknowledged

    @property
    def max_inbound_frame_size(self) -> int:
        """The largest frame the peer may send now (what it acknowledged)."""
        return self._scanner.max_frame_size

    def statistics(self) -> DriverStatistics:
        return DriverStatistics(
            streams_dropped=self._dropped,
            streams_reset_unanswered=self._reset_unanswered,
            streams_refused=self._refused,
        )

    # ------------------------------------------------------------------ writing

    async def flush(self, *, wait: bool = False) -> None:
        """Send what h2 queued. One task at a time moves bytes to the stream and keeps going until
        none are left, so a second caller's bytes go out after the first's, in order; that caller
        returns at once unless much is queued (or ``wait``: until everything is sent).

        A failed send fails the connection and raises ``trio.BrokenResourceError``."""
        chunks = data_to_send_chunks(self.conn)
        if chunks:
            self._queued.extend(chunks)
            self._queued_bytes += sum(map(len, chunks))
        while self._sending:
            if not wait and self._queued_bytes < _FLUSH_HIGH_WATER:
                return
            await self._drained.park()
        if not self._queued:
            return
        self._sending = True
        try:
            while self._queued:
                # Cancelled between two writes: what is queued stays queued (for ``aclose``'s
                # flush) rather than being taken and dropped by the next write's cancel point.
                await trio.lowlevel.checkpoint_if_cancelled()
                chunks, self._queued = self._queued, []
                self._queued_bytes = 0
                await send_many(self.stream, chunks)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._queued.clear()
            self.fail(f"connection lost while sending: {exc!r}")
            raise trio.BrokenResourceError(self.close_reason) from exc
        finally:
            self._sending = False
            self._drained.unpark_all()

    async def open_stream(self, headers: Headers, *, end_stream: bool = False) -> H2Stream:
        """A client's new request stream, its head sent (and flushed)."""
        if self.closed:
            raise trio.BrokenResourceError(self.close_reason)
        stream_id = self.conn.get_next_available_stream_id()
        h2s = H2Stream(self, stream_id, None)
        self.streams[stream_id] = h2s
        await h2s.send_headers(headers, end_stream=end_stream)
        return h2s

    # ------------------------------------------------------------------ reading

    async def run_reader(self, *, initial: bytes | bytearray = b"") -> None:
        """The connection's one reader: returns when the connection has ended (see ``close_reason``).
        ``initial``: bytes already read from the stream (a preface sniffed by the caller)."""
        self._reading = self._reader_task = True
        try:
            if initial:
                await self.pump(initial)
            while not self.closed:
                await self.pump()
        finally:
            self._reading = self._reader_task = False
            self._read_lot.unpark_all()
            self._window_lot.unpark_all()

    async def read_for(self, h2s: H2Stream, deadline: float = math.inf) -> None:
        """Without a reader task: read until ``h2s`` has something to take (data, its end, its
        error) or the connection ended, or ``deadline`` passed (only the wait for bytes is cut:
        what was read is always fed to h2 and answered). One task reads at a time; another that
        needs the reader meanwhile (a second stream's consumer, a sender waiting for a
        WINDOW_UPDATE) waits for it and reads itself once that one stopped. A connection read this
        way answers its own frames (SETTINGS, PING, WINDOW_UPDATE) only while some task waits in
        here or in ``send_data``."""
        while not h2s._buffer and not h2s._eof and h2s._error is None and not self.closed:
            if self._reading:
                with trio.move_on_at(deadline) as waited:
                    # ``run_reader`` wakes the stream as data arrives; another reader, its waiters
                    await (h2s._lot if self._reader_task else self._read_lot).park()
                if waited.cancelled_caught:
                    return
            elif not await self._read_once(deadline):
                return
            # (a read that brought nothing for this stream: the next one's scope ends at a passed
            # deadline at once, so no clock is read here)

    async def _read_once(self, deadline: float = math.inf) -> bool:
        """One read and its dispatch; False when ``deadline`` passed with nothing read."""
        self._reading = True
        try:
            if deadline == math.inf:
                await self.pump()
                return True
            data = None
            with trio.move_on_at(deadline):
                data = await self._receive()
            if data is None:  # the deadline passed (or the connection ended: ``closed`` says)
                return False
            await self.pump(data)
            return True
        finally:
            self._reading = False
            # whoever waited for this read (its data, or for the reading to be theirs) looks again
            if self._read_lot:
                self._read_lot.unpark_all()
            if self._window_lot:
                self._window_lot.unpark_all()

    async def _receive(self) -> bytes | bytearray | None:
        """One read from the stream; None (``closed`` set) once the connection is gone."""
        try:
            data = await self.stream.receive_some(self.receive_size)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.fail(f"connection lost: {exc!r}")
            return None
        if not data:
            self.fail("peer closed the connection")
            return None
        return data

    async def pump(self, data: bytes | bytearray | None = None) -> None:
        """Read once from the stream (or take ``data``), feed h2, dispatch its events, flush its
        answers. Never raises for the connection's end: that sets ``closed``."""
        if data is None:
            data = await self._receive()
            if data is None:
                return
        scanner = self._scanner
        try:
            splits = scanner.feed(data, resets_allowed=self._resets.available(trio.current_time()))
        except h2.exceptions.ProtocolError as exc:  # over a limit, or not HTTP/2: h2 never saw it
            self._go_away(exc)
            splits = ()
        if not self.closed:
            try:
                if scanner.reset_cut is not None:
                    # More resets than the budget holds: what follows them is decoded only if the
                    # budget survives them (the resets of answered streams are free).
                    cut = scanner.reset_cut
                    self._dispatch_all(self._receive_split(data[:cut], [s for s in splits if s < cut]))
                    data, splits = data[cut:], tuple(s - cut for s in splits if s > cut)
                if not self.closed:
                    events = self._receive_split(data, splits) if splits else self.conn.receive_data(data)
                    self._dispatch_all(events)
            except h2.exceptions.ProtocolError as exc:
                self.protocol_error = exc  # h2 queued a GOAWAY naming the error
                self.fail(f"HTTP/2 protocol error from peer: {exc}")
        try:
            await self.flush()
        except trio.BrokenResourceError:
            return

    def _receive_split(self, data: bytes | bytearray, splits: Sequence[int]) -> list[h2.events.Event]:
        """Feed h2 up to each SETTINGS ACK that changed the frame size limit, then on: h2 applies a
        new limit only when ``receive_data`` starts, so one call holding the ACK that raises it and
        a larger frame the peer sent right after its ACK would fail with "overlong frame"."""
        events: list[h2.events.Event] = []
        start = 0
        for end in splits:
            events.extend(self.conn.receive_data(data[start:end]))
            start = end
        if start < len(data):
            events.extend(self.conn.receive_data(data[start:]))
        return events

    def _dispatch_all(self, events: list[h2.events.Event]) -> None:
        """Dispatch one read's events; then hand over its new request streams, but none the peer
        reset in the same read (those never cost a task; they count against the reset budget)."""
        for event in events:
            if self.closed:
                break
            self._dispatch(event)
        if self._arrived:
            arrived, self._arrived = self._arrived, []
            for h2s in arrived:
                if self.closed:
                    return
                if h2s.reset_code is not None:
                    continue
                if self.on_request is None:
                    self.refuse(h2s)
                    continue
                h2s._handed_over = True
                self.on_request(h2s)

    def _dispatch(self, event: h2.events.Event) -> None:
        streams = self.streams
        if isinstance(event, h2.events.DataReceived):
            h2s = streams.get(event.stream_id)
            if h2s is not None:
                h2s._on_data(event.data, event.flow_controlled_length)
            else:
                self._acknowledge(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            h2s = streams.get(event.stream_id)
            if h2s is not None:
                h2s._on_eof()
        elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            self._window_lot.unpark_all()
        elif isinstance(event, h2.events.RequestReceived):
            stream_id: int = event.stream_id
            h2s = H2Stream(self, stream_id, list(event.headers or ()))
            h2s.opened_by_peer = True
            streams[stream_id] = h2s
            self._arrived.append(h2s)  # handed over once the whole read is dispatched
        elif isinstance(event, h2.events.ResponseReceived):
            h2s = streams.get(event.stream_id)
            if h2s is not None:
                h2s._on_head(list(event.headers or ()))
        elif isinstance(event, h2.events.TrailersReceived):
            h2s = streams.get(event.stream_id)
            if h2s is not None:
                h2s.trailers = list(event.headers or ())
        elif isinstance(event, h2.events.StreamReset):
            h2s = streams.pop(event.stream_id, None)
            if h2s is not None:
                h2s._on_reset(int(event.error_code or 0))
                if h2s.opened_by_peer and not h2s.answered:
                    if h2s._handed_over:
                        self._reset_unanswered += 1
                    else:
                        self._dropped += 1
                    self._spend_reset_budget()
            self._window_lot.unpark_all()  # a sender parked on this stream's window must see it
        elif isinstance(event, MalformedRequest):
            # reset already (RFC 9113 8.1.1: a stream error), its budget spent (``_malformed_allowed``);
            # a request already handed over (its body overran its content-length) learns it is reset
            self._refused += 1
            h2s = streams.pop(event.stream_id, None)
            if h2s is not None:
                h2s._on_reset(int(h2.errors.ErrorCodes.PROTOCOL_ERROR))
            self._window_lot.unpark_all()
        elif isinstance(event, h2.events.ConnectionTerminated):
            code = event.error_code
            self.fail(f"peer sent HTTP/2 GOAWAY (code {code})", clean=code == h2.errors.ErrorCodes.NO_ERROR)

    def refuse(self, h2s: H2Stream, code: h2.errors.ErrorCodes = h2.errors.ErrorCodes.REFUSED_STREAM) -> None:
        """Refuse a request stream before its handling began (RST_STREAM ``code``, sent with the
        next flush): it spends the reset budget, as a stream the peer reset would."""
        h2s.close()
        if self.closed:
            return
        try:
            self.conn.reset_stream(h2s.stream_id, code)
        except h2.exceptions.ProtocolError:
            return  # already closed both ways
        self._refused += 1
        self._spend_reset_budget()

    def _malformed_allowed(self) -> h2.exceptions.ProtocolError | None:
        """A malformed request (reset by h2trio.lean, as it arrives in the read) spends the reset
        budget; once it is empty, the error that ends the connection there (GOAWAY ENHANCE_YOUR_CALM)."""
        if self._resets.spend(trio.current_time()):
            return None
        limit = self.reset_limit
        return BudgetExceededError(
            f"more than {limit.budget} streams reset before their response or refused in {limit.window:g}s",
            h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)

    def _spend_reset_budget(self) -> None:
        if not self.closed and not self._resets.spend(trio.current_time()):
            limit = self.reset_limit
            self.go_away(
                h2.errors.ErrorCodes.ENHANCE_YOUR_CALM,
                f"more than {limit.budget} streams reset before their response or refused in {limit.window:g}s",
            )

    def go_away(self, error_code: h2.errors.ErrorCodes, reason: str) -> None:
        """End the connection because the peer went beyond a limit: GOAWAY ``error_code`` (with
        ``reason`` as its debug data; sent with the next flush), every stream fails, and
        ``protocol_error`` says why."""
        self._go_away(BudgetExceededError(reason, error_code))

    def _go_away(self, exc: h2.exceptions.ProtocolError) -> None:
        if self.closed:
            return
        self.protocol_error = exc
        try:
            self.conn.close_connection(error_code=exc.error_code, additional_data=str(exc).encode()[:256])
        except h2.exceptions.ProtocolError:
            pass  # h2 already ended the connection
        self.fail(f"sent HTTP/2 GOAWAY {_code_name(exc.error_code)}: {exc}")

    def _acknowledge(self, flow_length: int, stream_id: int) -> None:
        if flow_length and not self.closed:
            try:
                self.conn.acknowledge_received_data(flow_length, stream_id)
            except h2.exceptions.ProtocolError:
                pass  # the stream or connection is already closed: nothing to credit

    # ------------------------------------------------------------------ the end

    def fail(self, reason: str, *, clean: bool = False) -> None:
        """The connection is gone; ``clean`` (an orderly GOAWAY) reads as the end of each body."""
        if self.closed:
            return
        self.closed = True
        self.close_reason = reason
        for h2s in list(self.streams.values()):
            h2s._on_connection_end(reason, clean=clean)
        self._window_lot.unpark_all()
        self._read_lot.unpark_all()

    async def aclose(self) -> None:
        """GOAWAY (if the connection still stands), then close the stream; always closes, even when
        cancelled (bounded: a peer that does not read gets two seconds)."""
        with trio.move_on_after(2, shield=True):
            if not self.closed:
                try:
                    self.conn.close_connection()
                    await self.flush(wait=True)
                except (h2.exceptions.ProtocolError, trio.BrokenResourceError):
                    pass
            self.fail("closed by this side")
            await self.stream.aclose()


def _code_name(code: int) -> str:
    try:
        return h2.errors.ErrorCodes(code).name
    except ValueError:
        return str(code)


class H2Stream:
    """One HTTP/2 stream of an ``H2Driver``: its head, its inbound body, what to send."""

    __slots__ = (
        "_buffer",
        "_eof",
        "_error",
        "_handed_over",
        "_lot",
        "_scopes",
        "answered",
        "driver",
        "head",
        "opened_by_peer",
        "reset_code",
        "stream_id",
        "trailers",
    )

    def __init__(self, driver: H2Driver, stream_id: int, head: list[tuple[Any, Any]] | None) -> None:
        self.driver = driver
        self.stream_id = stream_id
        #: the request head (a server's stream) or, once it arrived, the response head (a client's)
        self.head = head
        self.trailers: list[tuple[Any, Any]] | None = None
        #: the peer's RST_STREAM code, once it reset the stream
        self.reset_code: int | None = None
        #: the peer opened this stream (a request to this side)
        self.opened_by_peer = False
        #: this side sent its head on the stream (a response began, or the request was sent)
        self.answered = False
        self._handed_over = False
        self._buffer: deque[tuple[bytes, int]] = deque()
        self._eof = False
        self._error: trio.BrokenResourceError | None = None
        self._lot = trio.lowlevel.ParkingLot()
        self._scopes: list[trio.CancelScope] = []

    # ------------------------------------------------------------------ fed by the reader

    def _on_head(self, head: list[tuple[Any, Any]]) -> None:
        self.head = head
        self._lot.unpark_all()

    def _on_data(self, data: bytes, flow_length: int) -> None:
        self._buffer.append((data, flow_length))
        self._lot.unpark_all()

    def _on_eof(self) -> None:
        self._eof = True
        self._lot.unpark_all()

    def _on_reset(self, code: int) -> None:
        self.reset_code = code
        # Nothing left to read; the connection's window gets the bytes back (h2 credits only it).
        while self._buffer:
            _, flow_length = self._buffer.popleft()
            self.driver._acknowledge(flow_length, self.stream_id)
        self._break(trio.BrokenResourceError(f"HTTP/2 stream reset by peer (code {code})"))

    def _on_connection_end(self, reason: str, *, clean: bool) -> None:
        if clean:
            self._eof = True
            self._lot.unpark_all()
            self._cancel_scopes()
        else:
            self._break(trio.BrokenResourceError(reason))

    def _break(self, error: trio.BrokenResourceError) -> None:
        if self._error is None:
            self._error = error
        self._lot.unpark_all()
        self._cancel_scopes()

    def _cancel_scopes(self) -> None:
        scopes, self._scopes = self._scopes, []
        for scope in scopes:
            scope.cancel()

    # ------------------------------------------------------------------ the consumer's side

    @property
    def ended_by_peer(self) -> bool:
        """The peer ended its side (END_STREAM): everything it sent is queued here."""
        return self._eof

    @property
    def buffered(self) -> bool:
        """Body bytes have arrived that the consumer has not taken yet."""
        return bool(self._buffer)

    @property
    def buffered_bytes(self) -> int:
        """Body bytes received and not taken yet: at most the stream's receive window (what
        this side announced), since they are acknowledged only as they are taken."""
        return sum(len(data) for data, _ in self._buffer)

    @property
    def broken(self) -> bool:
        """Reset by the peer, or its connection is gone."""
        return self._error is not None or (self.driver.closed and not self._eof)

    def cancel_when_broken(self, scope: trio.CancelScope) -> None:
        """Cancel ``scope`` when the peer resets this stream or the connection ends."""
        if self._error is not None or self.driver.closed:
            scope.cancel()
        else:
            self._scopes.append(scope)

    async def receive_head(self) -> list[tuple[Any, Any]]:
        """A client's stream: wait for the response head (someone must be reading: ``run_reader``)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        while self.head is None:
            if self._error is not None:
                raise self._error
            if self.driver.closed:
                raise trio.BrokenResourceError(self.driver.close_reason)
            await self._lot.park()
        return self.head

    async def receive_data(self, max_bytes: int | None = None) -> bytes:
        """Body bytes as they arrive (b"" once the peer ended the stream), acknowledged to the peer
        as they are taken: a consumer that does not read holds the sender back."""
        await trio.lowlevel.checkpoint_if_cancelled()
        while not self._buffer and not self._eof and self._error is None:
            await self._lot.park()
        if self.reset_code is not None:
            assert self._error is not None
            raise self._error  # even after END_STREAM: the peer took the stream back
        if self._buffer:
            data, flow_length = self._buffer.popleft()
            if max_bytes is not None and len(data) > max_bytes:
                # Only what is taken is acknowledged (with the frame's padding); the rest when it is
                # taken, so the peer never has more than the window unconsumed here.
                rest = data[max_bytes:]
                rest_flow = min(flow_length, len(rest))
                self._buffer.appendleft((rest, rest_flow))
                data, flow_length = data[:max_bytes], flow_length - rest_flow
            if flow_length and not self.driver.closed:
                self.driver._acknowledge(flow_length, self.stream_id)
                await self.driver.flush()
            return data
        if self._eof:
            return b""
        assert self._error is not None
        raise self._error

    async def read_data(self, max_bytes: int | None = None, *, deadline: float = math.inf) -> bytes | None:
        """``receive_data`` on a connection with no reader task: this reads the connection until
        the stream has something (``H2Driver.read_for``); None once ``deadline`` passed first."""
        if not self._buffer and not self._eof and self._error is None:
            driver = self.driver
            await driver.read_for(self, deadline)
            if not self._buffer and not self._eof and self._error is None:
                if not driver.closed:
                    return None  # the deadline passed
                # the connection ended after this side closed the stream (no longer told of it)
                raise trio.BrokenResourceError(driver.close_reason)
        return await self.receive_data(max_bytes)

    async def send_headers(self, headers: Headers, *, end_stream: bool = False) -> None:
        driver = self.driver
        self._check_sendable()
        try:
            driver.conn.send_headers(self.stream_id, headers, end_stream=end_stream)
        except h2.exceptions.ProtocolError as exc:
            raise trio.BrokenResourceError(f"HTTP/2 stream unusable: {exc}") from exc
        self.answered = True
        await driver.flush()

    async def send_data(self, data: bytes | bytearray | memoryview, *, end_stream: bool = False) -> None:
        """Send ``data`` as the flow-control windows allow, parking until they open."""
        driver = self.driver
        conn = driver.conn
        view = memoryview(data).cast("B")
        await trio.lowlevel.checkpoint_if_cancelled()
        while view:
            self._check_sendable()
            window = min(conn.local_flow_control_window(self.stream_id), conn.max_outbound_frame_size)
            if window <= 0:
                await driver.flush()
                if driver._reading or not driver.reads_on_demand:
                    await driver._window_lot.park()
                else:
                    # No task reads (the tunnel's consumer reads only when it wants data, and may
                    # itself wait for this send): the WINDOW_UPDATE that opens the window must
                    # still be read, so this sender reads meanwhile.
                    await driver._read_once()
                continue
            if window >= len(view) and isinstance(data, bytes) and len(view) == len(data):
                chunk, view = data, view[:0]  # the common case: all of it in one frame, no copy
            else:
                chunk, view = view[:window].tobytes(), view[window:]
            try:
                conn.send_data(self.stream_id, chunk, end_stream=end_stream and not view)
            except h2.exceptions.ProtocolError as exc:
                raise trio.BrokenResourceError(f"HTTP/2 stream unusable: {exc}") from exc
        if end_stream and not len(data):
            self._check_sendable()
            try:
                conn.end_stream(self.stream_id)
            except h2.exceptions.ProtocolError as exc:
                raise trio.BrokenResourceError(f"HTTP/2 stream unusable: {exc}") from exc
        await driver.flush()

    async def end_stream(self) -> None:
        """END_STREAM: this side sends nothing more on the stream."""
        await self.send_data(b"", end_stream=True)

    async def reset(self, code: int = h2.errors.ErrorCodes.CANCEL) -> None:
        """RST_STREAM (if the connection still stands), and forget the stream."""
        driver = self.driver
        self.close()
        if driver.closed or self.reset_code is not None:
            await trio.lowlevel.checkpoint()
            return
        try:
            driver.conn.reset_stream(self.stream_id, code)
        except h2.exceptions.ProtocolError:
            await trio.lowlevel.checkpoint()
            return  # already closed both ways: nothing to reset
        try:
            await driver.flush()
        except trio.BrokenResourceError:
            pass

    def close(self) -> None:
        """This side is done with the stream: DATA that still arrives is acknowledged and dropped."""
        driver = self.driver
        if driver.streams.get(self.stream_id) is self:
            del driver.streams[self.stream_id]
        while self._buffer:
            _, flow_length = self._buffer.popleft()
            driver._acknowledge(flow_length, self.stream_id)

    def _check_sendable(self) -> None:
        if self._error is not None:
            raise self._error
        if self.driver.closed:
            raise trio.BrokenResourceError(self.driver.close_reason)
