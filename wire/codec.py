"""msgpack encoding of frames and an incremental decoder with hard limits.

The decoder takes arbitrary chunks. Memory is bounded by the limits: msgpack rejects an oversized
array or map from its header; any frame whose bytes so far (an oversized string or bin included)
outgrow ``Limits.max_frame_bytes`` is rejected as soon as one fed slice shows it, so the unpacker's
buffer holds at most one partial frame plus one slice, under ``2 * max_frame_bytes``. Exceeding any
limit is ``FRAME_SIZE_ERROR``; anything else malformed is ``PROTOCOL_ERROR``; both are raised as
``RemoteProtocolError`` and nothing else ever escapes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import msgpack

from wire.errors import ErrorCode, RemoteProtocolError, UnsendableFrameError
from wire.frames import (
    Accept,
    Data,
    Frame,
    FrameKind,
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
from wire.settings import Limits

MAX_STREAM_ID = 2**31 - 1
MAX_OPAQUE = 2**64 - 1

_packb: Callable[[Any], bytes] = msgpack.Packer(use_bin_type=True, autoreset=True).pack


def encode(frame: Frame) -> bytes:
    """The msgpack bytes of one frame."""
    if type(frame) is Data:
        return data_header(frame.stream_id, len(frame.payload)) + frame.payload
    return _packb(_fields(frame))


def data_header(stream_id: int, size: int) -> bytes:
    """What precedes a DATA frame's payload of ``size`` bytes: exactly msgpack's encoding of
    ``[4, stream_id, payload]`` up to the payload, so the payload itself need not be copied."""
    sid = bytes((stream_id,)) if stream_id <= 0x7F else _sized(stream_id, _UINT_WIDTHS)
    return _DATA_PREFIX + sid + _sized(size, _BIN_WIDTHS)


#: msgpack's DATA frame opening (a fixarray of 3, the kind as a positive fixint), and its 8/16/32-bit
#: forms, marker → bytes of value that follow: what data_header writes and _take_data_frames reads
_DATA_PREFIX = bytes((0x93, FrameKind.DATA.value))
_UINT_WIDTHS = {0xCC: 1, 0xCD: 2, 0xCE: 4}
_BIN_WIDTHS = {0xC4: 1, 0xC5: 2, 0xC6: 4}


def _sized(value: int, widths: dict[int, int]) -> bytes:
    """``value`` in the smallest of the forms in ``widths`` that holds it (msgpack's rule)."""
    for marker, width in widths.items():
        if value < 1 << (8 * width):
            return bytes((marker,)) + value.to_bytes(width, "big")
    raise OverflowError(f"{value} does not fit in 32 bits")


def _fields(frame: Frame) -> list[Any]:
    match frame:
        case Hello():
            return [0, frame.major, frame.minor, frame.settings, frame.metadata]
        case Open() | Accept():
            return [frame.kind.value, frame.stream_id, frame.metadata]
        case Refuse() | Reset():
            return [frame.kind.value, frame.stream_id, int(frame.code), frame.message]
        case Data():
            return [4, frame.stream_id, frame.payload]
        case WindowUpdate():
            return [5, frame.stream_id, frame.increment]
        case HalfClose():
            return [6, frame.stream_id]
        case Ping() | Pong():
            return [frame.kind.value, frame.opaque]
        case GoAway():
            return [10, frame.last_stream_id, int(frame.code), frame.message]
        case Notice():
            return [11, frame.metadata]
    raise TypeError(f"not a frame: {frame!r}")  # pragma: no cover


def encode_checked(frame: Frame, limits: Limits) -> bytes:
    """Encode a frame, refusing what a peer with ``limits`` would reject as a session error.

    Limits are not exchanged, so a sender holds itself to the same limits it enforces: one oversized
    request head then fails one ``open_stream`` call instead of the whole session
    (``UnsendableFrameError``, a ``LocalProtocolError``; nothing is queued).
    """
    try:
        data = encode(frame)
    except (TypeError, ValueError, OverflowError) as exc:
        raise UnsendableFrameError(f"cannot encode {frame.kind.name}: {exc}") from None
    try:
        if frame.kind != FrameKind.DATA and len(data) > limits.max_control_frame:
            raise RemoteProtocolError(
                f"control frame of {len(data)} bytes exceeds {limits.max_control_frame}", ErrorCode.FRAME_SIZE_ERROR
            )
        # What the peer's decoder will check, checked on the values themselves: decoding our own
        # bytes again costs twice as much. Values of other types than the decoder returns (an
        # IntEnum, a bytearray, a dict subclass) take that slower way; tests hold both to one verdict.
        try:
            for value in _maps(frame):
                _check_sendable(value, limits, 1)
        except _Unusual:
            _validate(_unpackb(data, limits), len(data), limits)
    except RemoteProtocolError as exc:
        raise UnsendableFrameError(f"{frame.kind.name} frame over the limits: {exc.message}", exc.code) from None
    return data


def _maps(frame: Frame) -> tuple[object, ...]:
    """The maps a HELLO, OPEN or ACCEPT carries (the frames the mux checks); ``_Unusual`` for any
    other kind, which then takes the decoding way."""
    match frame:
        case Open() | Accept():
            _stream_id(frame.stream_id)
            return (frame.metadata,)
        case Hello():
            _uint(frame.major, "major version", _CODE_MAX)
            _uint(frame.minor, "minor version", _CODE_MAX)
            return (frame.settings, frame.metadata)
        case Notice():
            return (frame.metadata,)
    raise _Unusual


def _check_sendable(value: object, limits: Limits, depth: int) -> None:
    """A frame's map (or a container in it) as the receiving decoder will judge it: msgpack's
    length limits (``_unpack_kwargs``), then ``_check_value``. Scalars are checked inline in their
    container's loop, as there, so a request head costs one call per container."""
    kind = type(value)
    if kind not in _CONTAINERS:
        raise _Unusual
    if depth > limits.max_depth:
        raise RemoteProtocolError(f"metadata nested deeper than {limits.max_depth}", ErrorCode.FRAME_SIZE_ERROR)
    short = limits.max_string // 4  # msgpack limits UTF-8 bytes; a character is at most 4 of them
    if kind is dict:
        if len(value) > limits.max_map_entries:  # type: ignore[arg-type]
            raise RemoteProtocolError(f"map exceeds {limits.max_map_entries} entries", ErrorCode.FRAME_SIZE_ERROR)
        items: Iterable[object] = value.values()  # type: ignore[attr-defined]
        for key in value:  # type: ignore[attr-defined]
            if type(key) is not str:
                raise RemoteProtocolError("metadata keys must be strings")
            if len(key) > short:
                _check_string(key, limits)
    else:
        if len(value) > limits.max_array_items:  # type: ignore[arg-type]
            raise RemoteProtocolError(f"array exceeds {limits.max_array_items} items", ErrorCode.FRAME_SIZE_ERROR)
        items = value  # type: ignore[assignment]
    for item in items:
        item_kind = type(item)
        if item_kind is str:
            if len(item) > short:  # type: ignore[arg-type]
                _check_string(item, limits)  # type: ignore[arg-type]
        elif item_kind in _CONTAINERS:
            _check_sendable(item, limits, depth + 1)
        elif item_kind is bytes:
            if len(item) > limits.max_frame_payload:  # type: ignore[arg-type]
                raise RemoteProtocolError(f"bin exceeds {limits.max_frame_payload} bytes", ErrorCode.FRAME_SIZE_ERROR)
        elif item_kind not in _SCALARS:
            raise _Unusual


def _check_string(text: str, limits: Limits) -> None:
    if len(text.encode()) > limits.max_string:
        raise RemoteProtocolError(f"string exceeds {limits.max_string} bytes", ErrorCode.FRAME_SIZE_ERROR)


_CONTAINERS = (dict, list, tuple)


class _Unusual(Exception):
    """A value of a type ``_check_sendable`` does not judge itself."""


@functools.lru_cache(maxsize=16)
def _unpack_kwargs(limits: Limits) -> dict[str, Any]:
    """msgpack's own limits for ``limits`` (cached: every OPEN and ACCEPT is checked with them)."""
    return {
        "raw": False,
        "use_list": True,
        "strict_map_key": True,
        "max_bin_len": limits.max_frame_payload,
        "max_str_len": limits.max_string,
        "max_array_len": max(limits.max_array_items, 5),
        "max_map_len": limits.max_map_entries,
        "max_ext_len": 0,
    }


def _unpackb(data: bytes, limits: Limits) -> object:
    try:
        return msgpack.unpackb(data, **_unpack_kwargs(limits))
    except Exception as exc:
        raise _decode_error(exc) from None


def _decode_error(exc: Exception) -> RemoteProtocolError:
    """Map msgpack's zoo of exceptions (ValueError, FormatError, StackError, …) to one type."""
    if isinstance(exc, msgpack.StackError):
        return RemoteProtocolError("msgpack nested too deep", ErrorCode.FRAME_SIZE_ERROR)
    text = str(exc)
    # msgpack reports its length limits as ValueError("N exceeds max_..._len(M)"); ext types are not
    # part of the protocol at all, so an ext of any length is malformed rather than oversized.
    if isinstance(exc, ValueError) and "exceeds max_" in text and "max_ext_len" not in text:
        return RemoteProtocolError(f"undecodable frame: {text}", ErrorCode.FRAME_SIZE_ERROR)
    return RemoteProtocolError(f"undecodable frame: {type(exc).__name__}: {text}")


def byte_view(data: bytes | bytearray | memoryview) -> memoryview:
    """``data`` as a flat view of bytes, so that lengths and slices count bytes, not items."""
    view = memoryview(data)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


#: most bytes handed to msgpack at once
_SLICE = 16 * 1024


class FrameDecoder:
    """Feed bytes in any chunking; get whole, validated frames out."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self._slice = min(self.limits.max_frame_bytes, _SLICE)
        self._max_buffer = self.limits.max_frame_bytes + self._slice
        # The unpacker exists only while a frame is partly received: msgpack's unpacker costs ~40 KiB
        # (its parse stack) plus its buffer, and an idle session should cost far less than that.
        self._unpacker: msgpack.Unpacker | None = None
        self._base = 0  # stream offset where the current unpacker started
        self._consumed = 0  # stream offset of the end of the last whole frame
        self._fed = 0  # stream offset of the end of the bytes fed so far
        # A DATA frame whose header was read and whose payload is partly here (bulk transfers cut
        # frames at every read): its stream, the payload bytes still to come, and those so far.
        self._data_sid = 0
        self._data_left = 0
        self._data_pieces: list[bytes | bytearray | memoryview] = []
        #: the start of a DATA frame's header, held back until the rest of the header is here
        self._carry = b""

    def _new_unpacker(self) -> msgpack.Unpacker:
        # A partial frame never holds more than max_frame_bytes (see _drain), so it plus one slice
        # always fits; the buffer starts at one slice and grows on demand up to that cap.
        self._base = self._consumed
        return msgpack.Unpacker(
            max_buffer_size=self._max_buffer, read_size=self._slice, **_unpack_kwargs(self.limits)
        )

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        frames: list[Frame] = []
        view = byte_view(data)
        if self._carry:
            view = self._finish_header(view, frames)
        if self._data_left and view:
            view = self._continue_data(view, frames)
        if self._unpacker is None and not self._data_left and view:
            # Nothing partial: DATA frames are cut out directly (bulk transfers are nearly all
            # DATA), whole or, the last one, partly; whatever else follows takes the general path.
            view = self._take_data(view, frames)
        # Feed a slice at a time and check the partial frame after each, so the unpacker buffer
        # (partial frame + slice) stays bounded however large ``data`` is.
        for start in range(0, len(view), self._slice):
            piece = view[start : start + self._slice]
            if self._unpacker is None:
                self._unpacker = self._new_unpacker()
            try:
                self._unpacker.feed(piece)
            except msgpack.BufferFull:  # pragma: no cover - the running size check fires first
                raise RemoteProtocolError(
                    f"frame larger than {self.limits.max_frame_bytes} bytes", ErrorCode.FRAME_SIZE_ERROR
                ) from None
            self._fed += len(piece)
            self._drain(self._unpacker, frames)
        if self._fed == self._consumed:
            self._unpacker = None  # nothing partial: let go of the parse stack and buffer
        return frames

    def _take_data(self, view: memoryview, frames: list[Frame]) -> memoryview:
        """Cut the DATA frames at the start of ``view`` out of it (``_take_data_frames``); a last one
        whose payload is not all here yet is begun, and the start of a header is held back. Returns
        what is left for the general decoder."""
        max_payload = self.limits.max_frame_payload
        taken = _take_data_frames(view, max_payload, frames)
        self._fed += taken
        self._consumed += taken
        end = len(view)
        if taken == end:
            return view[end:]
        sid, length, start = _data_frame_header(view, taken, max_payload)
        if start > 0:  # a header, and part of the payload: whole frames were all taken above
            self._fed = self._consumed + (end - taken)
            self._data_sid = sid
            self._data_left = length - (end - start)
            self._data_pieces = []
            self._add_piece(view[start:])
            return view[end:]
        if start < 0:  # the start of a DATA header, nothing else: wait for the rest of it
            self._carry = bytes(view[taken:])
            return view[end:]
        return view[taken:]

    def _finish_header(self, view: memoryview, frames: list[Frame]) -> memoryview:
        """The header held back, completed from ``view``: begin its frame; or, if it turns out not
        to be one the fast path takes, hand it to the general decoder. Returns the rest of ``view``."""
        carry = self._carry
        head = carry + bytes(view[:_MAX_DATA_HEADER])
        sid, length, start = _data_frame_header(memoryview(head), 0, self.limits.max_frame_payload)
        if start < 0 and len(head) < _MAX_DATA_HEADER:
            self._carry = head  # still only the start of a header
            return view[len(view) :]
        self._carry = b""
        if start == 0 or start < 0:  # not a frame the fast path takes: the general decoder judges it
            self._unpacker = self._new_unpacker()
            self._unpacker.feed(carry)
            self._fed += len(carry)
            self._drain(self._unpacker, frames)
            return view
        used = start - len(carry)
        self._fed += start
        self._data_sid = sid
        self._data_left = length
        self._data_pieces = []
        if not length:
            self._end_data(frames)
        return view[used:]

    def _continue_data(self, view: memoryview, frames: list[Frame]) -> memoryview:
        take = min(self._data_left, len(view))
        self._add_piece(view[:take])
        self._data_left -= take
        self._fed += take
        if not self._data_left:
            self._end_data(frames)
        return view[take:]

    def _add_piece(self, piece: memoryview) -> None:
        """Keep part of a DATA payload until the rest comes: a large part of an immutable buffer as
        a view of it (copied once, when the frame is whole), anything else copied now, small parts
        into one bytearray, so a peer's chunking cannot make the parts cost more than the payload."""
        pieces = self._data_pieces
        size = len(piece)
        source = piece.obj
        if size >= _VIEW_AT_LEAST and type(source) is bytes and 4 * size >= len(source):
            pieces.append(piece)
        elif size >= _VIEW_AT_LEAST:
            pieces.append(bytes(piece))
        else:
            last = pieces[-1] if pieces else None
            if isinstance(last, bytearray):
                last.extend(piece)
            else:
                pieces.append(bytearray(piece))

    def _end_data(self, frames: list[Frame]) -> None:
        pieces = self._data_pieces
        payload = pieces[0] if len(pieces) == 1 and type(pieces[0]) is bytes else b"".join(pieces)
        frames.append(Data(stream_id=self._data_sid, payload=bytes(payload)))
        self._data_pieces = []
        self._consumed = self._fed

    def _drain(self, unpacker: msgpack.Unpacker, frames: list[Frame]) -> None:
        while True:
            try:
                obj = unpacker.unpack()
            except msgpack.OutOfData:
                # Everything fed since the last whole frame belongs to the partial one: once that
                # outgrows the limit the frame is oversized, whatever its headers claimed. (Parts of it
                # already parsed have left the buffer, so the buffer cap alone would not bound it.)
                if self._fed - self._consumed > self.limits.max_frame_bytes:
                    raise RemoteProtocolError(
                        f"frame larger than {self.limits.max_frame_bytes} bytes", ErrorCode.FRAME_SIZE_ERROR
                    ) from None
                return
            except Exception as exc:
                raise _decode_error(exc) from None
            end = self._base + unpacker.tell()
            size = end - self._consumed
            self._consumed = end
            frames.append(_validate(obj, size, self.limits))


#: the kind of a DATA frame, as an int (an enum's ``.value`` is a property: slow in a loop per frame)
_DATA_KIND = int(FrameKind.DATA.value)
#: longest DATA frame header the fast path reads: fixarray, kind, uint32 stream id, bin32 length
_MAX_DATA_HEADER = 2 + 5 + 5
#: parts of a DATA payload at least this long are kept as they came (see ``_add_piece``)
_VIEW_AT_LEAST = 4 * 1024


def _data_frame_header(view: memoryview, pos: int, max_payload: int) -> tuple[int, int, int]:
    """The DATA frame header at ``pos``: (stream id, payload length, offset of the payload) when it
    is whole and one the fast path takes; (0, 0, -1) when what is there is only the start of such a
    header; (0, 0, 0) when it is not one (another kind, a partial frame of msgpack's other forms, an
    oversized payload …: the general decoder decides)."""
    end = len(view)
    if pos >= end or view[pos] != 0x93:
        return 0, 0, 0
    if pos + 1 >= end:
        return 0, 0, -1
    if view[pos + 1] != _DATA_KIND:
        return 0, 0, 0
    i = pos + 2
    if i >= end:
        return 0, 0, -1
    marker = view[i]
    if marker <= 0x7F:
        stream_id = marker
        i += 1
    else:
        width = _UINT_WIDTHS.get(marker, 0)
        if not width:
            return 0, 0, 0
        if end - i < 1 + width:
            return 0, 0, -1
        stream_id = int.from_bytes(view[i + 1 : i + 1 + width], "big")
        i += 1 + width
    if stream_id == 0 or stream_id > MAX_STREAM_ID:
        return 0, 0, 0
    if i >= end:
        return 0, 0, -1
    width = _BIN_WIDTHS.get(view[i], 0)
    if not width:
        return 0, 0, 0
    if end - i < 1 + width:
        return 0, 0, -1
    length = int.from_bytes(view[i + 1 : i + 1 + width], "big")
    if length > max_payload:
        return 0, 0, 0
    return stream_id, length, i + 1 + width


def _take_data_frames(view: memoryview, max_payload: int, frames: list[Frame]) -> int:
    """Decode the DATA frames that lie whole at the start of ``view``, as msgpack would but without
    its buffer copies; returns the bytes consumed. Stops at anything else — another kind, a partial
    frame, a non-canonical encoding, an oversized payload — for the caller to handle (and, if it
    must, the general decoder to reject), so this path accepts exactly what the general one does."""
    pos = 0
    end = len(view)
    while True:
        stream_id, length, start = _data_frame_header(view, pos, max_payload)
        if start <= 0 or end - start < length:
            return pos
        frames.append(Data(stream_id=stream_id, payload=bytes(view[start : start + length])))
        pos = start + length


def _validate(obj: object, size: int, limits: Limits) -> Frame:
    if type(obj) is not list or not obj or type(obj[0]) is not int:
        raise RemoteProtocolError("a frame must be a msgpack array starting with its kind")
    kind = obj[0]
    if kind != FrameKind.DATA and size > limits.max_control_frame:
        raise RemoteProtocolError(
            f"control frame of {size} bytes exceeds {limits.max_control_frame}", ErrorCode.FRAME_SIZE_ERROR
        )
    parser = _PARSERS.get(kind)
    if parser is None:
        raise RemoteProtocolError(f"unknown frame kind {kind}")
    arity, parse = parser
    if len(obj) != arity:
        raise RemoteProtocolError(f"{FrameKind(kind).name} frame needs {arity - 1} fields, got {len(obj) - 1}")
    return parse(obj, limits)


def _uint(value: object, what: str, maximum: int) -> int:
    if type(value) is not int or not 0 <= value <= maximum:
        raise RemoteProtocolError(f"{what} must be an integer in 0..{maximum}, got {value!r:.40}")
    return value


def _stream_id(value: object) -> int:
    sid = _uint(value, "stream id", MAX_STREAM_ID)
    if sid == 0:
        raise RemoteProtocolError("stream id 0 is the session itself")
    return sid


def _text(value: object, what: str) -> str:
    if type(value) is not str:
        raise RemoteProtocolError(f"{what} must be a string")
    return value


def _metadata(value: object, limits: Limits) -> Metadata:
    if type(value) is not dict:
        raise RemoteProtocolError("metadata must be a map")
    _check_value(value, limits, 1)
    return value


_SCALARS = (type(None), bool, int, float, str, bytes)


def _check_value(value: object, limits: Limits, depth: int) -> None:
    # Scalars are checked in their container's loop: a request head is mostly [name, value] pairs,
    # and a call per string would cost more than the rest of the check.
    kind = type(value)
    if kind in _SCALARS:
        return
    if depth > limits.max_depth:
        raise RemoteProtocolError(f"metadata nested deeper than {limits.max_depth}", ErrorCode.FRAME_SIZE_ERROR)
    if kind is dict:
        for key, item in value.items():  # type: ignore[attr-defined]
            if type(key) is not str:
                raise RemoteProtocolError("metadata keys must be strings")
            if type(item) not in _SCALARS:
                _check_value(item, limits, depth + 1)
    elif kind is list:
        # msgpack's own max_array_len must also admit the frame's array (5 items), so a smaller
        # limit is enforced here
        if len(value) > limits.max_array_items:  # type: ignore[arg-type]
            raise RemoteProtocolError(
                f"metadata array of {len(value)} items exceeds {limits.max_array_items}",  # type: ignore[arg-type]
                ErrorCode.FRAME_SIZE_ERROR,
            )
        for item in value:  # type: ignore[attr-defined]
            if type(item) not in _SCALARS:
                _check_value(item, limits, depth + 1)
    else:
        raise RemoteProtocolError(f"metadata value of unsupported type {kind.__name__}")


def _parse_hello(o: list[Any], limits: Limits) -> Frame:
    if type(o[3]) is not dict:
        raise RemoteProtocolError("HELLO settings must be a map")
    settings = _metadata(o[3], limits)
    return Hello(
        major=_uint(o[1], "major version", _CODE_MAX),
        minor=_uint(o[2], "minor version", _CODE_MAX),
        settings=settings,
        metadata=_metadata(o[4], limits),
    )


def _parse_data(o: list[Any], limits: Limits) -> Frame:
    payload = o[2]
    if type(payload) is not bytes:
        raise RemoteProtocolError("DATA payload must be bin")
    return Data(stream_id=_stream_id(o[1]), payload=payload)


def _parse_window_update(o: list[Any], limits: Limits) -> Frame:
    increment = _uint(o[2], "window increment", 2**31 - 1)
    if increment == 0:
        raise RemoteProtocolError("window increment of 0")
    return WindowUpdate(stream_id=_stream_id(o[1]), increment=increment)


_CODE_MAX = 2**32 - 1

_PARSERS: dict[int, tuple[int, Callable[[list[Any], Limits], Frame]]] = {
    FrameKind.HELLO: (5, _parse_hello),
    FrameKind.OPEN: (3, lambda o, lim: Open(stream_id=_stream_id(o[1]), metadata=_metadata(o[2], lim))),
    FrameKind.ACCEPT: (3, lambda o, lim: Accept(stream_id=_stream_id(o[1]), metadata=_metadata(o[2], lim))),
    FrameKind.REFUSE: (
        4,
        lambda o, lim: Refuse(
            stream_id=_stream_id(o[1]), code=_uint(o[2], "error code", _CODE_MAX), message=_text(o[3], "message")
        ),
    ),
    FrameKind.DATA: (3, _parse_data),
    FrameKind.WINDOW_UPDATE: (3, _parse_window_update),
    FrameKind.HALF_CLOSE: (2, lambda o, lim: HalfClose(stream_id=_stream_id(o[1]))),
    FrameKind.RESET: (
        4,
        lambda o, lim: Reset(
            stream_id=_stream_id(o[1]), code=_uint(o[2], "error code", _CODE_MAX), message=_text(o[3], "message")
        ),
    ),
    FrameKind.PING: (2, lambda o, lim: Ping(opaque=_uint(o[1], "ping opaque", MAX_OPAQUE))),
    FrameKind.PONG: (2, lambda o, lim: Pong(opaque=_uint(o[1], "pong opaque", MAX_OPAQUE))),
    FrameKind.NOTICE: (2, lambda o, lim: Notice(metadata=_metadata(o[1], lim))),
    FrameKind.GOAWAY: (
        4,
        lambda o, lim: GoAway(
            last_stream_id=_uint(o[1], "last stream id", MAX_STREAM_ID),
            code=_uint(o[2], "error code", _CODE_MAX),
            message=_text(o[3], "message"),
        ),
    ),
}

