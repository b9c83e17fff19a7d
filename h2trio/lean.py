"""The fence around h2's and hyperframe's internals: the fast paths of HTTP/2 and what they rely on.

Everything in the project that touches a private name of h2 or hyperframe is in this module. What it
relies on, as checked against h2 4.4.1 and hyperframe 6.1.0 (the upper bounds pinned in
``pyproject.toml``; ``tests/h2trio/test_lean.py`` asserts each one and names it when it breaks):

1. ``hyperframe.frame.DataFrame._body_repr(self) -> str`` exists and is what ``repr(frame)`` uses for
   the payload. h2 builds ``repr(frame)`` for a trace log line on every frame it receives, whether
   or not anyone logs it, and hyperframe's DataFrame repr hex-encodes the *whole* payload before
   truncating it to 20 characters: a third of a receiver's CPU at 1 MiB frames. We replace it with
   one that states the length.
2. ``h2.frame_buffer.FrameBuffer`` keeps unparsed bytes in ``self._data`` (a ``bytearray``),
   headers being assembled in ``self._headers_buffer`` (empty between header blocks), checks a
   length with ``self._validate_frame_length(length)``, and yields frames from ``__next__``
   (raising ``StopIteration`` when more bytes are needed). ``_LeanFrameBuffer`` parses a DATA
   frame's body in place (h2 copies it out of its buffer, then again into the frame).
3. ``h2.connection.H2Connection`` queues outgoing bytes in ``self._data_to_send`` (a
   ``bytearray``; the connection preface is written there directly), serialises every frame it
   sends through ``self._prepare_for_sending(frames: list[Frame])``, keeps its receive buffer in
   ``self.incoming_buffer`` (replaceable, with a ``max_frame_size``), and empties its queue in
   ``clear_outbound_data_buffer()``. ``_LeanH2Connection`` queues a DATA frame as its 9-byte header
   plus the payload object itself (h2 copies an outgoing payload four times, ``data_to_send`` a
   fifth) and hands the list to a vectored send.

4. ``h2.connection.H2Connection._receive_headers_frame(frame)`` is h2's handling of a HEADERS frame
   (copied here, for a server, with ``h2.connection._decode_headers``, ``ConnectionInputs``,
   ``AllowedStreamIDs``, ``self.open_inbound_streams``, ``self._get_or_create_stream`` and
   ``self._receive_priority_frame``), and ``H2Stream.receive_headers`` raises ``ProtocolError`` for
   a header block that decoded but is not a valid request (a name in upper case, a
   connection-specific header, a pseudo-header twice or out of place, a ``content-length`` that is
   not one number), and ``_receive_data_frame`` raises ``InvalidBodyLengthError`` for a body longer
   or shorter than its ``content-length``, after taking the frame from the connection's window. h2
   makes those connection errors: a GOAWAY ending every stream on the
   connection, where RFC 9113 (8.1.1) makes a malformed request a stream error. ``_StreamErrors``
   (every server connection, lean or not) resets that stream alone (``RST_STREAM
   PROTOCOL_ERROR``) and reports it as a ``MalformedRequest`` event, which the driver counts
   against the reset budget; HPACK failures and everything else stay connection errors.

With ``KASD_SAFE_MODE`` set (``netio.safemode``) none of the fast paths is used: ``new_connection``
returns a plain ``H2Connection`` (with item 4 for a server), and the repr is hyperframe's own.
``data_to_send_chunks`` works on both.
"""

from __future__ import annotations

import struct
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.frame_buffer
import h2.settings
import hyperframe.exceptions
import hyperframe.frame

from netio.safemode import SAFE_MODE

__all__ = ["CHECKED_VERSIONS", "LEAN", "MalformedRequest", "StreamErrors", "data_to_send_chunks", "new_connection"]

#: the versions whose internals this module was checked against (pinned as upper bounds)
CHECKED_VERSIONS = {"h2": "4.4.1", "hyperframe": "6.1.0"}

#: whether the fast paths are on (False under KASD_SAFE_MODE)
LEAN = not SAFE_MODE


def _data_frame_body_repr(self: hyperframe.frame.DataFrame) -> str:
    return f"<{len(self.data)} bytes>"


if LEAN:
    hyperframe.frame.DataFrame._body_repr = _data_frame_body_repr  # type: ignore[method-assign,assignment]


_FRAME_HEADER = struct.Struct(">HBBBL")


class _LeanFrameBuffer(h2.frame_buffer.FrameBuffer):
    """h2's receive buffer, parsing a DATA frame's body in place: h2 first copies the body out of
    its buffer and then copies it again into the frame (one of those copies is enough)."""

    def __next__(self) -> hyperframe.frame.Frame:
        data = self._data
        if len(data) < 9 or data[3] != 0x0 or self._headers_buffer:
            return super().__next__()  # not a DATA frame (or one the general path must reject)
        length = int.from_bytes(data[:3], "big")
        if len(data) < 9 + length:
            raise StopIteration
        self._validate_frame_length(length)
        frame, _ = hyperframe.frame.Frame.parse_frame_header(memoryview(data[:9]))
        with memoryview(data) as view:
            body = view[9 : 9 + length]
            try:
                frame.parse_body(body)  # takes its payload with .tobytes(): nothing keeps the view
            except hyperframe.exceptions.InvalidDataError as err:
                raise h2.exceptions.ProtocolError("Received frame with non-compliant data") from err
            except hyperframe.exceptions.InvalidFrameError as err:
                raise h2.exceptions.FrameDataMissingError("Frame data missing or invalid") from err
            finally:
                body.release()
        del data[: 9 + length]
        return frame


class MalformedRequest(h2.events.Event):
    """A request whose header block decoded but is not a valid request: its stream alone was reset
    (``RST_STREAM PROTOCOL_ERROR``, queued), nothing else on the connection is touched."""

    def __init__(self, stream_id: int, reason: str) -> None:
        self.stream_id = stream_id
        self.reason = reason

    def __repr__(self) -> str:
        return f"<MalformedRequest stream_id:{self.stream_id}, reason:{self.reason}>"


class _StreamErrors(h2.connection.H2Connection):
    """A server's connection where a malformed request is a stream error (module docstring, item 4).
    ``malformed_allowed`` (set by the driver: it spends the reset budget) is asked at each one; once
    it says no, the rest of the read is not decoded: a connection error (its ``ProtocolError``)."""

    def malformed_allowed(self) -> h2.exceptions.ProtocolError | None:
        return None

    def _receive_headers_frame(self, frame: hyperframe.frame.HeadersFrame) -> tuple[list[hyperframe.frame.Frame],
                                                                                 list[h2.events.Event]]:
        if self.config.client_side:
            return super()._receive_headers_frame(frame)
        # h2 4.4.1's own steps, up to the stream's
        if frame.stream_id not in self.streams:
            max_open_streams = self.local_settings.max_concurrent_streams
            value = self.open_inbound_streams
            if (value + 1) > max_open_streams:
                raise h2.exceptions.TooManyStreamsError(f"Max inbound streams is {max_open_streams}, {value} open")
        headers = h2.connection._decode_headers(self.decoder, frame.data)  # HPACK: its failure stays fatal
        events: list[h2.events.Event] = self.state_machine.process_input(h2.connection.ConnectionInputs.RECV_HEADERS)
        stream = self._get_or_create_stream(frame.stream_id, h2.connection.AllowedStreamIDs(not self.config.client_side))
        try:
            frames, stream_events = stream.receive_headers(headers, "END_STREAM" in frame.flags,
                                                           self.config.header_encoding)
        except h2.exceptions.StreamClosedError:
            raise  # h2's own: a reset stream's frames are answered with RST_STREAM, the rest is fatal
        except h2.exceptions.ProtocolError as exc:
            refusal = self.malformed_allowed()
            if refusal is not None:  # over the budget: one read of malformed requests must not cost more
                raise refusal from exc
            return [], [*events, self._malformed(frame.stream_id, exc)]
        if "PRIORITY" in frame.flags:
            p_frames, p_events = self._receive_priority_frame(frame)
            first, update = stream_events[0], p_events[0]
            assert isinstance(first, h2.events.RequestReceived | h2.events.TrailersReceived)
            assert isinstance(update, h2.events.PriorityUpdated)
            first.priority_updated = update
            stream_events.extend(p_events)
            frames = [*frames, *p_frames]
        return frames, events + stream_events

    def _receive_data_frame(self, frame: hyperframe.frame.DataFrame) -> tuple[list[hyperframe.frame.Frame],
                                                                          list[h2.events.Event]]:
        try:
            return super()._receive_data_frame(frame)
        except h2.exceptions.InvalidBodyLengthError as exc:  # more (or less) than its content-length
            if self.config.client_side:
                raise
            refusal = self.malformed_allowed()
            if refusal is not None:
                raise refusal from exc
            malformed = self._malformed(frame.stream_id, exc)
            # h2 took the frame from the connection's window before the stream refused it: give it back
            self.acknowledge_received_data(frame.flow_controlled_length, frame.stream_id)
            return [], [malformed]

    def _malformed(self, stream_id: int, exc: h2.exceptions.ProtocolError) -> MalformedRequest:
        try:
            self.reset_stream(stream_id, h2.errors.ErrorCodes.PROTOCOL_ERROR)
        except h2.exceptions.ProtocolError:  # the stream's state machine had closed it: say it anyway
            rst = hyperframe.frame.RstStreamFrame(stream_id)
            rst.error_code = h2.errors.ErrorCodes.PROTOCOL_ERROR
            self._prepare_for_sending([rst])
        return MalformedRequest(stream_id, str(exc))


class _Values(list[Any]):
    """A setting's values (the current one first, then those sent and not yet acknowledged): the
    part of ``collections.deque`` that ``h2.settings.Settings`` uses, in a list. An empty deque
    takes ~0.7 KiB; h2 keeps one per setting, both ways: ~10 KiB of an idle tunnel end."""

    __slots__ = ()

    def popleft(self) -> Any:
        return self.pop(0)


class _CompactSettings(h2.settings.Settings):
    """``h2.settings.Settings`` whose values are ``_Values`` lists rather than deques."""

    def __setitem__(self, key: h2.settings.SettingCodes | int, value: int) -> None:
        if key not in self._settings:
            self._settings[key] = _Values([None])  # type: ignore[assignment]  # h2's placeholder for "not set before"
        super().__setitem__(key, value)


def _compact(settings: h2.settings.Settings) -> None:
    settings._settings = {key: _Values(values) for key, values in settings._settings.items()}  # type: ignore[misc]
    settings.__class__ = _CompactSettings


class _LeanH2Connection(_StreamErrors):
    """h2, queuing DATA payloads without copying them (see the module docstring, item 3), its
    settings kept in lists (``_CompactSettings``)."""

    def __init__(self, config: h2.config.H2Configuration) -> None:
        super().__init__(config)
        _compact(self.local_settings)
        _compact(self.remote_settings)
        self._chunks: list[bytes] = []
        lean = _LeanFrameBuffer(server=not config.client_side)
        lean.max_frame_size = self.incoming_buffer.max_frame_size
        self.incoming_buffer = lean

    def _take_bytearray(self) -> None:
        # h2 writes its connection preamble straight into its buffer: keep it first, in order.
        if self._data_to_send:
            self._chunks.append(bytes(self._data_to_send))
            self._data_to_send = bytearray()

    def _prepare_for_sending(self, frames: list[hyperframe.frame.Frame]) -> None:
        if not frames:
            return
        self._take_bytearray()
        chunks = self._chunks
        for frame in frames:
            if type(frame) is hyperframe.frame.DataFrame and "PADDED" not in frame.flags:
                size = len(frame.data)
                frame.body_len = size
                flags = 0x1 if "END_STREAM" in frame.flags else 0
                chunks.append(_FRAME_HEADER.pack((size >> 8) & 0xFFFF, size & 0xFF, 0x0, flags, frame.stream_id))
                if size:
                    chunks.append(frame.data)
            else:
                chunks.append(frame.serialize())

    def data_to_send_chunks(self) -> list[bytes]:
        """Everything queued, as a list of buffers (in order), and forget it."""
        self._take_bytearray()
        chunks, self._chunks = self._chunks, []
        return chunks

    def data_to_send(self, amount: int | None = None) -> bytes:
        if amount is not None:
            raise NotImplementedError("partial data_to_send is not used by the drivers of h2")
        return b"".join(self.data_to_send_chunks())

    def clear_outbound_data_buffer(self) -> None:
        super().clear_outbound_data_buffer()
        self._chunks = []


def new_connection(config: h2.config.H2Configuration) -> h2.connection.H2Connection:
    """An ``H2Connection`` for ``config``: the lean one, or h2's own under KASD_SAFE_MODE."""
    if LEAN:
        return _LeanH2Connection(config)
    return _StreamErrors(config) if not config.client_side else h2.connection.H2Connection(config)


def data_to_send_chunks(conn: h2.connection.H2Connection) -> list[bytes]:
    """What ``conn`` queued to send, as buffers in order (for a vectored send), and forget it."""
    if isinstance(conn, _LeanH2Connection):
        return conn.data_to_send_chunks()
    data = conn.data_to_send()
    return [data] if data else []


#: a server connection that resets a malformed request's stream alone (item 4)
StreamErrors = _StreamErrors
