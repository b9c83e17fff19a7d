"""SPDY/3.1 framing and a connection state machine, as kubectl speaks it (sans-I/O).

kubectl's SPDY transport for exec, attach and port-forward (k8s.io/apimachinery's
`util/httpstream/spdy`) runs moby/spdystream, whose `spdy` package is the framer Go once kept in
`golang.org/x/net`. This module speaks what that framer writes and reads, checked against the
SPDY/3 draft: 8-byte frame heads, control frames SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS,
PING, GOAWAY, HEADERS and WINDOW_UPDATE, and DATA frames. Header blocks are zlib-compressed with
the SPDY/3 dictionary, one compression context per direction for the whole connection (a block
is flushed with Z_SYNC_FLUSH, never finished), so every block must be inflated in order even when
its stream is refused or unknown.

`Connection` takes bytes in any chunking (`receive_data(data) -> list[Event]`) and queues what it
must answer (`data_to_send()`); it never touches a socket or a clock. What a peer sends is bounded
before it is buffered (`Limits`): the length of a frame, the size of a header block after
inflation (a zlib bomb stops at the limit, not at the end of its output), the number of open
streams. A peer that breaks the protocol gets a `RemoteProtocolError` naming the fault and a
GOAWAY queued in `data_to_send()`; the error is sticky. Misuse of the API is a
`LocalProtocolError`.

Flow control: SPDY/3.1 has stream and session windows, but spdystream neither sends
WINDOW_UPDATE nor honours it, so a sender that waited for windows would stall kubectl after
64 KiB. WINDOW_UPDATE frames are parsed and reported; no window is enforced either way.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Sequence
from typing import Final

import attrs

VERSION: Final = 3

# Control frame types.
SYN_STREAM: Final = 1
SYN_REPLY: Final = 2
RST_STREAM: Final = 3
SETTINGS: Final = 4
PING: Final = 6
GOAWAY: Final = 7
HEADERS: Final = 8
WINDOW_UPDATE: Final = 9

FLAG_FIN: Final = 0x01
FLAG_UNIDIRECTIONAL: Final = 0x02  # SYN_STREAM only
FLAG_SETTINGS_CLEAR: Final = 0x01  # SETTINGS only

# RST_STREAM status codes.
PROTOCOL_ERROR: Final = 1
INVALID_STREAM: Final = 2
REFUSED_STREAM: Final = 3
UNSUPPORTED_VERSION: Final = 4
CANCEL: Final = 5
INTERNAL_ERROR: Final = 6
FLOW_CONTROL_ERROR: Final = 7
STREAM_IN_USE: Final = 8
STREAM_ALREADY_CLOSED: Final = 9
FRAME_TOO_LARGE: Final = 11

# GOAWAY status codes.
GOAWAY_OK: Final = 0
GOAWAY_PROTOCOL_ERROR: Final = 1
GOAWAY_INTERNAL_ERROR: Final = 2

#: The largest length a frame head can carry (24 bits).
MAX_FRAME_LENGTH: Final = (1 << 24) - 1
_MAX_ID: Final = (1 << 31) - 1
_HEAD = struct.Struct(">II")
_U32 = struct.Struct(">I")
_U32x2 = struct.Struct(">II")

#: The SPDY/3 header compression dictionary (1423 bytes, adler32 0xe3c6a7c2), as
#: moby/spdystream spdy/dictionary.go has it (commit f0be51f30e2e861eaa06b3374fd0f3c2512038bc,
#: "Copyright 2013 The Go Authors"; identical to Chromium's kV3Dictionary in
#: net/spdy/spdy_protocol.h). tests/kubesim/test_spdy.py pins its length and hashes.
DICTIONARY: Final = bytes.fromhex(
    "000000076f7074696f6e73000000046865616400000004706f73740000000370"
    "75740000000664656c6574650000000574726163650000000661636365707400"
    "00000e6163636570742d636861727365740000000f6163636570742d656e636f"
    "64696e670000000f6163636570742d6c616e67756167650000000d6163636570"
    "742d72616e6765730000000361676500000005616c6c6f770000000d61757468"
    "6f72697a6174696f6e0000000d63616368652d636f6e74726f6c0000000a636f"
    "6e6e656374696f6e0000000c636f6e74656e742d6261736500000010636f6e74"
    "656e742d656e636f64696e6700000010636f6e74656e742d6c616e6775616765"
    "0000000e636f6e74656e742d6c656e67746800000010636f6e74656e742d6c6f"
    "636174696f6e0000000b636f6e74656e742d6d64350000000d636f6e74656e74"
    "2d72616e67650000000c636f6e74656e742d7479706500000004646174650000"
    "0004657461670000000665787065637400000007657870697265730000000466"
    "726f6d00000004686f73740000000869662d6d617463680000001169662d6d6f"
    "6469666965642d73696e63650000000d69662d6e6f6e652d6d61746368000000"
    "0869662d72616e67650000001369662d756e6d6f6469666965642d73696e6365"
    "0000000d6c6173742d6d6f646966696564000000086c6f636174696f6e000000"
    "0c6d61782d666f72776172647300000006707261676d610000001270726f7879"
    "2d61757468656e7469636174650000001370726f78792d617574686f72697a61"
    "74696f6e0000000572616e676500000007726566657265720000000b72657472"
    "792d61667465720000000673657276657200000002746500000007747261696c"
    "6572000000117472616e736665722d656e636f64696e67000000077570677261"
    "64650000000a757365722d6167656e7400000004766172790000000376696100"
    "0000077761726e696e67000000107777772d61757468656e7469636174650000"
    "00066d6574686f64000000036765740000000673746174757300000006323030"
    "204f4b0000000776657273696f6e00000008485454502f312e31000000037572"
    "6c000000067075626c69630000000a7365742d636f6f6b69650000000a6b6565"
    "702d616c697665000000066f726967696e313030313031323031323032323035"
    "3230363330303330323330333330343330353330363330373430323430353430"
    "3634303734303834303934313034313134313234313334313434313534313634"
    "3137353032353034353035323033204e6f6e2d417574686f7269746174697665"
    "20496e666f726d6174696f6e323034204e6f20436f6e74656e74333031204d6f"
    "766564205065726d616e656e746c793430302042616420526571756573743430"
    "3120556e617574686f72697a656434303320466f7262696464656e343034204e"
    "6f7420466f756e6435303020496e7465726e616c20536572766572204572726f"
    "72353031204e6f7420496d706c656d656e746564353033205365727669636520"
    "556e617661696c61626c654a616e20466562204d617220417072204d6179204a"
    "756e204a756c204175672053657074204f6374204e6f76204465632030303a30"
    "303a3030204d6f6e2c205475652c205765642c205468752c204672692c205361"
    "742c2053756e2c20474d546368756e6b65642c746578742f68746d6c2c696d61"
    "67652f706e672c696d6167652f6a70672c696d6167652f6769662c6170706c69"
    "636174696f6e2f786d6c2c6170706c69636174696f6e2f7868746d6c2b786d6c"
    "2c746578742f706c61696e2c746578742f6a6176617363726970742c7075626c"
    "6963707269766174656d61782d6167653d677a69702c6465666c6174652c7364"
    "6368636861727365743d7574662d38636861727365743d69736f2d383835392d"
    "312c7574662d2c2a2c656e713d302e"
)

#: A header block: (name, value) pairs, names lowercase. A name with several values appears
#: once per value; on the wire they share one entry, joined by NUL (as Go's http.Header).
Headers = tuple[tuple[str, str], ...]


# -- errors --------------------------------------------------------------------------------------


class SpdyError(Exception):
    """Base of this module's errors."""


class LocalProtocolError(SpdyError):
    """This side misused the API (sending on a closed stream, a header name in capitals...)."""


class RemoteProtocolError(SpdyError):
    """The peer broke the protocol. Fatal for the connection: `goaway_status` is what was sent."""

    def __init__(self, message: str, *, goaway_status: int = GOAWAY_PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.goaway_status = goaway_status


# -- frames --------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class DataFrame:
    stream_id: int
    data: bytes
    fin: bool = False


@attrs.frozen(kw_only=True)
class SynStreamFrame:
    stream_id: int
    associated_to: int = 0
    priority: int = 0  # 0 (highest) to 7
    slot: int = 0
    headers: Headers = ()
    fin: bool = False
    unidirectional: bool = False


@attrs.frozen(kw_only=True)
class SynReplyFrame:
    stream_id: int
    headers: Headers = ()
    fin: bool = False


@attrs.frozen(kw_only=True)
class RstStreamFrame:
    stream_id: int
    status: int


@attrs.frozen(kw_only=True)
class Setting:
    id: int  # 24 bits
    value: int  # 32 bits
    flags: int = 0  # 8 bits: 1 persist value, 2 persisted


@attrs.frozen(kw_only=True)
class SettingsFrame:
    settings: tuple[Setting, ...] = ()
    clear: bool = False


@attrs.frozen(kw_only=True)
class PingFrame:
    ping_id: int


@attrs.frozen(kw_only=True)
class GoAwayFrame:
    last_good_stream_id: int
    status: int = GOAWAY_OK


@attrs.frozen(kw_only=True)
class HeadersFrame:
    stream_id: int
    headers: Headers = ()
    fin: bool = False


@attrs.frozen(kw_only=True)
class WindowUpdateFrame:
    stream_id: int  # 0: the session's window
    delta: int


Frame = (
    DataFrame
    | SynStreamFrame
    | SynReplyFrame
    | RstStreamFrame
    | SettingsFrame
    | PingFrame
    | GoAwayFrame
    | HeadersFrame
    | WindowUpdateFrame
)


@attrs.frozen(kw_only=True)
class Limits:
    """What a peer may make this side buffer. Defaults fit kubectl with a wide margin: its frames
    carry at most 32 KiB (Go's io.Copy buffer) and its header blocks a few dozen bytes."""

    #: The largest frame accepted, its 8-byte head excluded (at most 2**24 - 1).
    max_frame_length: int = 1 << 20
    #: The largest header block after inflation.
    max_header_block: int = 64 << 10
    #: Streams open at once (either half still open); a SYN_STREAM past it is refused.
    max_streams: int = 128

    def __attrs_post_init__(self) -> None:
        if not 8 <= self.max_frame_length <= MAX_FRAME_LENGTH:
            raise ValueError(f"max_frame_length must be 8 to {MAX_FRAME_LENGTH}")
        if self.max_header_block < 4 or self.max_streams < 1:
            raise ValueError("max_header_block must be at least 4 and max_streams at least 1")


# -- header blocks ------------------------------------------------------------------------------


def _check_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[bytes, list[bytes]]]:
    """Group `headers` by name (first occurrence order) as the wire wants them."""
    grouped: dict[bytes, list[bytes]] = {}
    for name, value in headers:
        if not name or name != name.lower():
            raise LocalProtocolError(f"header name {name!r} must be non-empty and lowercase")
        if "\0" in value:
            raise LocalProtocolError(f"header {name!r}: a value may not contain NUL")
        try:
            grouped.setdefault(name.encode("latin-1"), []).append(value.encode("latin-1"))
        except UnicodeEncodeError as exc:
            raise LocalProtocolError(f"header {name!r} is not latin-1: {exc}") from None
    return list(grouped.items())


def encode_header_block(headers: Iterable[tuple[str, str]]) -> bytes:
    """The uncompressed SPDY/3 name/value block: 32-bit count, then 32-bit lengths and bytes."""
    grouped = _check_headers(headers)
    out = [_U32.pack(len(grouped))]
    for name, values in grouped:
        value = b"\0".join(values)
        out += [_U32.pack(len(name)), name, _U32.pack(len(value)), value]
    return b"".join(out)


def decode_header_block(block: bytes) -> Headers:
    """The pairs of an uncompressed name/value block; it must end exactly where its entries do."""

    def take(offset: int, what: str) -> tuple[bytes, int]:
        if offset + 4 > len(block):
            raise RemoteProtocolError(f"header block truncated in the length of {what}")
        (length,) = _U32.unpack_from(block, offset)
        end = offset + 4 + length
        if end > len(block):
            raise RemoteProtocolError(f"header block truncated in {what} ({length} bytes)")
        return block[offset + 4 : end], end

    if len(block) < 4:
        raise RemoteProtocolError("header block shorter than its entry count")
    (count,) = _U32.unpack_from(block, 0)
    # Each entry takes at least 8 bytes: a count past that is a lie, caught before any work.
    if count > (len(block) - 4) // 8:
        raise RemoteProtocolError(f"header block claims {count} entries in {len(block)} bytes")
    pairs: list[tuple[str, str]] = []
    seen: set[bytes] = set()
    offset = 4
    for _ in range(count):
        name, offset = take(offset, "a header name")
        value, offset = take(offset, "a header value")
        if not name:
            raise RemoteProtocolError("header block holds an empty header name")
        if name != name.lower():
            raise RemoteProtocolError(f"header name {name!r} is not lowercase")
        if name in seen:
            raise RemoteProtocolError(f"header block repeats the name {name!r}")
        seen.add(name)
        text = name.decode("latin-1")
        pairs += [(text, v.decode("latin-1")) for v in value.split(b"\0")]
    if offset != len(block):
        raise RemoteProtocolError(f"{len(block) - offset} bytes after the header block's entries")
    return tuple(pairs)


class HeaderCompressor:
    """One direction's zlib stream: each block is sync-flushed, so the peer can inflate it."""

    def __init__(self) -> None:
        self._deflate = zlib.compressobj(zlib.Z_BEST_COMPRESSION, zdict=DICTIONARY)

    def compress(self, headers: Iterable[tuple[str, str]]) -> bytes:
        block = encode_header_block(headers)
        return self._deflate.compress(block) + self._deflate.flush(zlib.Z_SYNC_FLUSH)


class HeaderDecompressor:
    """The peer's zlib stream, inflated block by block, never past `max_block` bytes a block."""

    def __init__(self, max_block: int) -> None:
        self._inflate = zlib.decompressobj(zdict=DICTIONARY)
        self._max_block = max_block

    def decompress(self, compressed: bytes) -> Headers:
        try:
            block = self._inflate.decompress(compressed, self._max_block + 1)
        except zlib.error as exc:
            raise RemoteProtocolError(f"header block does not inflate: {exc}") from None
        if len(block) > self._max_block or self._inflate.unconsumed_tail:
            raise RemoteProtocolError(f"header block inflates past {self._max_block} bytes")
        if self._inflate.eof:
            # A finished zlib stream leaves nothing to inflate the next block with.
            raise RemoteProtocolError("header compression stream was ended by the peer")
        return decode_header_block(block)


# -- frame codec --------------------------------------------------------------------------------


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise LocalProtocolError(message)


def _check_stream_id(stream_id: int, what: str, *, zero: bool = False) -> None:
    _check(
        (0 if zero else 1) <= stream_id <= _MAX_ID, f"{what}: stream id {stream_id} out of range"
    )


def _control(frame_type: int, flags: int, payload: bytes) -> bytes:
    _check(len(payload) <= MAX_FRAME_LENGTH, f"control frame of {len(payload)} bytes is too long")
    return (
        _HEAD.pack(0x8000_0000 | VERSION << 16 | frame_type, flags << 24 | len(payload)) + payload
    )


class FrameEncoder:
    """Frames to bytes, with this direction's header compression context."""

    def __init__(self) -> None:
        self._headers = HeaderCompressor()

    def encode(self, frame: Frame) -> bytes:
        match frame:
            case DataFrame(stream_id=sid, data=data, fin=fin):
                _check_stream_id(sid, "DATA")
                _check(len(data) <= MAX_FRAME_LENGTH, f"DATA of {len(data)} bytes is too long")
                return _HEAD.pack(sid, (FLAG_FIN if fin else 0) << 24 | len(data)) + data
            case SynStreamFrame():
                _check_stream_id(frame.stream_id, "SYN_STREAM")
                _check_stream_id(frame.associated_to, "SYN_STREAM", zero=True)
                _check(0 <= frame.priority <= 7, f"priority {frame.priority} is not 0 to 7")
                _check(0 <= frame.slot <= 255, f"slot {frame.slot} is not 0 to 255")
                flags = (FLAG_FIN if frame.fin else 0) | (
                    FLAG_UNIDIRECTIONAL if frame.unidirectional else 0
                )
                head = _U32x2.pack(frame.stream_id, frame.associated_to)
                head += bytes((frame.priority << 5, frame.slot))
                return _control(SYN_STREAM, flags, head + self._headers.compress(frame.headers))
            case SynReplyFrame(stream_id=sid, headers=headers, fin=fin):
                _check_stream_id(sid, "SYN_REPLY")
                block = self._headers.compress(headers)
                return _control(SYN_REPLY, FLAG_FIN if fin else 0, _U32.pack(sid) + block)
            case HeadersFrame(stream_id=sid, headers=headers, fin=fin):
                _check_stream_id(sid, "HEADERS")
                block = self._headers.compress(headers)
                return _control(HEADERS, FLAG_FIN if fin else 0, _U32.pack(sid) + block)
            case RstStreamFrame(stream_id=sid, status=status):
                _check_stream_id(sid, "RST_STREAM")
                _check(0 < status < 1 << 32, f"RST_STREAM status {status} out of range")
                return _control(RST_STREAM, 0, _U32x2.pack(sid, status))
            case SettingsFrame(settings=settings, clear=clear):
                body = [_U32.pack(len(settings))]
                for s in settings:
                    _check(0 <= s.id < 1 << 24, f"setting id {s.id} out of range")
                    _check(0 <= s.flags < 1 << 8, f"setting flags {s.flags} out of range")
                    _check(0 <= s.value < 1 << 32, f"setting value {s.value} out of range")
                    body.append(_U32x2.pack(s.flags << 24 | s.id, s.value))
                return _control(SETTINGS, FLAG_SETTINGS_CLEAR if clear else 0, b"".join(body))
            case PingFrame(ping_id=ping_id):
                _check(0 < ping_id < 1 << 32, f"PING id {ping_id} out of range")
                return _control(PING, 0, _U32.pack(ping_id))
            case GoAwayFrame(last_good_stream_id=last, status=status):
                _check_stream_id(last, "GOAWAY", zero=True)
                _check(0 <= status < 1 << 32, f"GOAWAY status {status} out of range")
                return _control(GOAWAY, 0, _U32x2.pack(last, status))
            case WindowUpdateFrame(stream_id=sid, delta=delta):
                _check_stream_id(sid, "WINDOW_UPDATE", zero=True)
                _check(0 < delta <= _MAX_ID, f"WINDOW_UPDATE delta {delta} out of range")
                return _control(WINDOW_UPDATE, 0, _U32x2.pack(sid, delta))
        raise LocalProtocolError(f"not a frame: {frame!r}")


_CONTROL_TYPES: Final = {
    SYN_STREAM: "SYN_STREAM",
    SYN_REPLY: "SYN_REPLY",
    RST_STREAM: "RST_STREAM",
    SETTINGS: "SETTINGS",
    PING: "PING",
    GOAWAY: "GOAWAY",
    HEADERS: "HEADERS",
    WINDOW_UPDATE: "WINDOW_UPDATE",
}
#: Fixed payload lengths; SYN_STREAM, SYN_REPLY, HEADERS and SETTINGS have a minimum instead.
_FIXED_LENGTH: Final = {RST_STREAM: 8, PING: 4, GOAWAY: 8, WINDOW_UPDATE: 8}
_MIN_LENGTH: Final = {SYN_STREAM: 10, SYN_REPLY: 4, HEADERS: 4, SETTINGS: 4}


class FrameDecoder:
    """Bytes to frames, any chunking, with the peer's header compression context.

    A frame's head is checked (version, type, length against `Limits.max_frame_length`) as soon
    as its 8 bytes are in, before its payload is buffered. Every error is a `RemoteProtocolError`
    and leaves the decoder unusable (its zlib context may be mid-block).
    """

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self._buffer = bytearray()
        self._headers = HeaderDecompressor(self.limits.max_header_block)

    def receive(self, data: bytes) -> list[Frame]:
        self._buffer += data
        frames: list[Frame] = []
        while (frame := self._next_frame()) is not None:
            frames.append(frame)
        return frames

    def _next_frame(self) -> Frame | None:
        buffer = self._buffer
        if len(buffer) < 8:
            return None
        first, second = _HEAD.unpack_from(buffer)
        flags, length = second >> 24, second & 0xFF_FFFF
        control = bool(first & 0x8000_0000)
        if control:
            version, frame_type = first >> 16 & 0x7FFF, first & 0xFFFF
            if version != VERSION:
                raise RemoteProtocolError(f"control frame of SPDY version {version}, not 3")
            name = _CONTROL_TYPES.get(frame_type)
            if name is None:
                raise RemoteProtocolError(f"unknown control frame type {frame_type}")
            fixed = _FIXED_LENGTH.get(frame_type)
            if fixed is not None and length != fixed:
                raise RemoteProtocolError(f"{name} of length {length}, not {fixed}")
            if length < _MIN_LENGTH.get(frame_type, 0):
                raise RemoteProtocolError(f"{name} of length {length} is too short")
        if length > self.limits.max_frame_length:
            raise RemoteProtocolError(
                f"frame of {length} bytes is over the limit of {self.limits.max_frame_length}"
            )
        if len(buffer) < 8 + length:
            return None
        payload = bytes(buffer[8 : 8 + length])
        del buffer[: 8 + length]
        if not control:
            stream_id = first & _MAX_ID
            if stream_id == 0:
                raise RemoteProtocolError("DATA frame on stream 0")
            return DataFrame(stream_id=stream_id, data=payload, fin=bool(flags & FLAG_FIN))
        return self._control_frame(frame_type, flags, payload)

    def _control_frame(self, frame_type: int, flags: int, payload: bytes) -> Frame:
        fin = bool(flags & FLAG_FIN)
        if frame_type == SETTINGS:
            (count,) = _U32.unpack_from(payload)
            if len(payload) != 4 + 8 * count:
                raise RemoteProtocolError(f"SETTINGS of {len(payload)} bytes for {count} entries")
            settings = []
            for offset in range(4, len(payload), 8):
                flags_id, value = _U32x2.unpack_from(payload, offset)
                settings.append(Setting(id=flags_id & 0xFF_FFFF, value=value, flags=flags_id >> 24))
            return SettingsFrame(settings=tuple(settings), clear=bool(flags & FLAG_SETTINGS_CLEAR))
        if frame_type == PING:
            (ping_id,) = _U32.unpack(payload)
            if ping_id == 0:
                raise RemoteProtocolError("PING with id 0")
            return PingFrame(ping_id=ping_id)
        first, second = _U32x2.unpack_from(payload) if len(payload) >= 8 else (0, 0)
        if frame_type == GOAWAY:
            return GoAwayFrame(last_good_stream_id=first & _MAX_ID, status=second)
        if frame_type == WINDOW_UPDATE:
            return WindowUpdateFrame(stream_id=first & _MAX_ID, delta=second & _MAX_ID)
        (raw_id,) = _U32.unpack_from(payload)
        stream_id = raw_id & _MAX_ID
        name = _CONTROL_TYPES[frame_type]
        if stream_id == 0:
            raise RemoteProtocolError(f"{name} on stream 0")
        if frame_type == RST_STREAM:
            if second == 0:
                raise RemoteProtocolError(f"RST_STREAM of stream {stream_id} with status 0")
            return RstStreamFrame(stream_id=stream_id, status=second)
        if frame_type == SYN_STREAM:
            # The block is inflated even for a stream that will be refused: the zlib context is
            # shared by every block of the connection.
            headers = self._headers.decompress(payload[10:])
            return SynStreamFrame(
                stream_id=stream_id,
                associated_to=second & _MAX_ID,
                priority=payload[8] >> 5,
                slot=payload[9],
                headers=headers,
                fin=fin,
                unidirectional=bool(flags & FLAG_UNIDIRECTIONAL),
            )
        headers = self._headers.decompress(payload[4:])
        if frame_type == SYN_REPLY:
            return SynReplyFrame(stream_id=stream_id, headers=headers, fin=fin)
        return HeadersFrame(stream_id=stream_id, headers=headers, fin=fin)


# -- events -------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class StreamOpened:
    """The peer's SYN_STREAM: a new stream (answer it with `Connection.reply`)."""

    stream_id: int
    headers: Headers
    fin: bool  # the peer will send nothing on it
    unidirectional: bool  # this side may send nothing on it
    priority: int
    associated_to: int


@attrs.frozen(kw_only=True)
class StreamReplied:
    """The peer's SYN_REPLY to a stream this side opened."""

    stream_id: int
    headers: Headers
    fin: bool


@attrs.frozen(kw_only=True)
class HeadersReceived:
    stream_id: int
    headers: Headers
    fin: bool


@attrs.frozen(kw_only=True)
class DataReceived:
    stream_id: int
    data: bytes
    fin: bool  # the peer's half of the stream is closed


@attrs.frozen(kw_only=True)
class StreamReset:
    """A stream ended abnormally: by the peer's RST_STREAM, or by one this side sent."""

    stream_id: int
    status: int
    by_peer: bool


@attrs.frozen(kw_only=True)
class SettingsReceived:
    settings: tuple[Setting, ...]
    clear: bool


@attrs.frozen(kw_only=True)
class PingReceived:
    """The peer's PING; the echo is already queued."""

    ping_id: int


@attrs.frozen(kw_only=True)
class PingAcknowledged:
    """The echo of a PING this side sent."""

    ping_id: int


@attrs.frozen(kw_only=True)
class GoAwayReceived:
    last_good_stream_id: int
    status: int


@attrs.frozen(kw_only=True)
class WindowUpdated:
    stream_id: int
    delta: int


Event = (
    StreamOpened
    | StreamReplied
    | HeadersReceived
    | DataReceived
    | StreamReset
    | SettingsReceived
    | PingReceived
    | PingAcknowledged
    | GoAwayReceived
    | WindowUpdated
)


# -- connection ---------------------------------------------------------------------------------


@attrs.define
class _Stream:
    local_open: bool  # this side may still send
    remote_open: bool  # the peer may still send
    replied: bool  # SYN_REPLY sent (the peer's streams) or received (ours)


#: kubectl writes what one read gave it in one frame (32 KiB); so does this side.
OUTBOUND_DATA_CHUNK: Final = 32 << 10


class Connection:
    """One SPDY/3.1 session: bytes in, events out; calls in, bytes to send out.

    `client=False` (the default, kubesim's side) means the peer opens odd-numbered streams and
    this side even-numbered ones, as in SPDY; pings follow the same parity.
    """

    def __init__(self, *, client: bool = False, limits: Limits | None = None) -> None:
        self.client = client
        self.limits = limits or Limits()
        self._decoder = FrameDecoder(self.limits)
        self._encoder = FrameEncoder()
        self._out = bytearray()
        self._streams: dict[int, _Stream] = {}
        self._parity = 1 if client else 0  # stream id % 2 of this side's streams
        self._next_stream_id = 1 if client else 2
        self._next_ping_id = 1 if client else 2
        self._pings: set[int] = set()
        self._last_peer_stream_id = 0
        self._error: RemoteProtocolError | None = None
        self.goaway_sent = False
        self.goaway_received = False

    # -- what the caller reads ------------------------------------------------------------------

    @property
    def open_streams(self) -> frozenset[int]:
        return frozenset(self._streams)

    @property
    def error(self) -> RemoteProtocolError | None:
        """The protocol error that ended the connection, if one did."""
        return self._error

    def data_to_send(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        return out

    def receive_data(self, data: bytes) -> list[Event]:
        """Events for `data`, the next bytes from the peer. A protocol error raises
        `RemoteProtocolError` (again on every later call) and queues a GOAWAY."""
        if self._error is not None:
            raise self._error
        events: list[Event] = []
        try:
            for frame in self._decoder.receive(data):
                events += self._handle(frame)
        except RemoteProtocolError as exc:
            self._error = exc
            if not self.goaway_sent:
                self._send(
                    GoAwayFrame(
                        last_good_stream_id=self._last_peer_stream_id, status=exc.goaway_status
                    )
                )
                self.goaway_sent = True
            raise
        return events

    # -- what the caller sends ------------------------------------------------------------------

    def open_stream(
        self,
        headers: Sequence[tuple[str, str]],
        *,
        fin: bool = False,
        unidirectional: bool = False,
        priority: int = 0,
        associated_to: int = 0,
    ) -> int:
        self._check_usable()
        if self.goaway_received or self.goaway_sent:
            raise LocalProtocolError("no new streams after a GOAWAY")
        stream_id = self._next_stream_id
        if stream_id > _MAX_ID:
            raise LocalProtocolError("stream ids are exhausted")
        self._send(
            SynStreamFrame(
                stream_id=stream_id,
                associated_to=associated_to,
                priority=priority,
                headers=tuple(headers),
                fin=fin,
                unidirectional=unidirectional,
            )
        )
        self._next_stream_id += 2
        self._streams[stream_id] = _Stream(
            local_open=not fin, remote_open=not unidirectional, replied=False
        )
        self._forget_if_closed(stream_id)
        return stream_id

    def reply(
        self, stream_id: int, headers: Sequence[tuple[str, str]], *, fin: bool = False
    ) -> None:
        """SYN_REPLY to the peer's stream `stream_id`."""
        stream = self._sendable(stream_id)
        if self._is_local(stream_id) or stream.replied:
            raise LocalProtocolError(f"stream {stream_id} is not the peer's, or was replied to")
        self._send(SynReplyFrame(stream_id=stream_id, headers=tuple(headers), fin=fin))
        stream.replied = True
        self._half_close_local(stream_id, stream, fin)

    def send_headers(
        self, stream_id: int, headers: Sequence[tuple[str, str]], *, fin: bool = False
    ) -> None:
        stream = self._sendable(stream_id)
        self._send(HeadersFrame(stream_id=stream_id, headers=tuple(headers), fin=fin))
        self._half_close_local(stream_id, stream, fin)

    def send_data(self, stream_id: int, data: bytes, *, fin: bool = False) -> None:
        """`data` in frames of at most `OUTBOUND_DATA_CHUNK` bytes; `fin` on the last one."""
        stream = self._sendable(stream_id)
        view = memoryview(data)
        for start in range(0, max(len(view), 1), OUTBOUND_DATA_CHUNK):
            chunk = bytes(view[start : start + OUTBOUND_DATA_CHUNK])
            last = start + OUTBOUND_DATA_CHUNK >= len(view)
            self._send(DataFrame(stream_id=stream_id, data=chunk, fin=fin and last))
        self._half_close_local(stream_id, stream, fin)

    def end_stream(self, stream_id: int) -> None:
        """Close this side's half of the stream (an empty DATA frame with FIN)."""
        self.send_data(stream_id, b"", fin=True)

    def reset_stream(self, stream_id: int, status: int = CANCEL) -> None:
        self._check_usable()
        if stream_id not in self._streams:
            raise LocalProtocolError(f"stream {stream_id} is not open")
        self._send(RstStreamFrame(stream_id=stream_id, status=status))
        del self._streams[stream_id]

    def ping(self) -> int:
        self._check_usable()
        ping_id = self._next_ping_id
        if ping_id >= 1 << 32:
            raise LocalProtocolError("ping ids are exhausted")
        self._send(PingFrame(ping_id=ping_id))
        self._next_ping_id += 2
        self._pings.add(ping_id)
        return ping_id

    def send_settings(self, settings: Sequence[Setting], *, clear: bool = False) -> None:
        self._check_usable()
        self._send(SettingsFrame(settings=tuple(settings), clear=clear))

    def window_update(self, stream_id: int, delta: int) -> None:
        self._check_usable()
        self._send(WindowUpdateFrame(stream_id=stream_id, delta=delta))

    def close(self, status: int = GOAWAY_OK) -> None:
        """GOAWAY: this side accepts no new streams; those it accepted may finish."""
        if not self.goaway_sent:
            self._send(GoAwayFrame(last_good_stream_id=self._last_peer_stream_id, status=status))
            self.goaway_sent = True

    # -- internals ------------------------------------------------------------------------------

    def _send(self, frame: Frame) -> None:
        self._out += self._encoder.encode(frame)

    def _check_usable(self) -> None:
        if self._error is not None:
            raise LocalProtocolError(f"the connection failed: {self._error}")

    def _sendable(self, stream_id: int) -> _Stream:
        self._check_usable()
        stream = self._streams.get(stream_id)
        if stream is None or not stream.local_open:
            raise LocalProtocolError(f"stream {stream_id} is not open for sending")
        return stream

    def _is_local(self, stream_id: int) -> bool:
        return stream_id % 2 == self._parity

    def _half_close_local(self, stream_id: int, stream: _Stream, fin: bool) -> None:
        if fin:
            stream.local_open = False
            self._forget_if_closed(stream_id)

    def _forget_if_closed(self, stream_id: int) -> None:
        stream = self._streams.get(stream_id)
        if stream is not None and not stream.local_open and not stream.remote_open:
            del self._streams[stream_id]

    def _stream_error(self, stream_id: int, status: int) -> list[Event]:
        self._send(RstStreamFrame(stream_id=stream_id, status=status))
        self._streams.pop(stream_id, None)
        return [StreamReset(stream_id=stream_id, status=status, by_peer=False)]

    def _receivable(self, stream_id: int) -> _Stream | list[Event]:
        """The open stream a frame is for, or the events (and reset) for a frame that is not."""
        stream = self._streams.get(stream_id)
        if stream is None:
            was_opened = (
                stream_id < self._next_stream_id
                if self._is_local(stream_id)
                else stream_id <= self._last_peer_stream_id
            )
            if was_opened:
                return []  # in flight when the stream ended (its RST or last FIN): ignored
            self._send(RstStreamFrame(stream_id=stream_id, status=INVALID_STREAM))
            return []
        if not stream.remote_open:
            return self._stream_error(stream_id, STREAM_ALREADY_CLOSED)
        return stream

    def _handle(self, frame: Frame) -> list[Event]:
        match frame:
            case SynStreamFrame():
                return self._on_syn_stream(frame)
            case SynReplyFrame(stream_id=sid, headers=headers, fin=fin):
                stream = self._receivable(sid)
                if isinstance(stream, list):
                    return stream
                if not self._is_local(sid):
                    return self._stream_error(sid, PROTOCOL_ERROR)
                if stream.replied:
                    return self._stream_error(sid, STREAM_IN_USE)
                stream.replied = True
                self._half_close_remote(sid, stream, fin)
                return [StreamReplied(stream_id=sid, headers=headers, fin=fin)]
            case HeadersFrame(stream_id=sid, headers=headers, fin=fin):
                stream = self._receivable(sid)
                if isinstance(stream, list):
                    return stream
                self._half_close_remote(sid, stream, fin)
                return [HeadersReceived(stream_id=sid, headers=headers, fin=fin)]
            case DataFrame(stream_id=sid, data=data, fin=fin):
                stream = self._receivable(sid)
                if isinstance(stream, list):
                    return stream
                self._half_close_remote(sid, stream, fin)
                return [DataReceived(stream_id=sid, data=data, fin=fin)]
            case RstStreamFrame(stream_id=sid, status=status):
                # Never answered, even for an unknown stream: two sides must not trade resets.
                if self._streams.pop(sid, None) is None:
                    return []
                return [StreamReset(stream_id=sid, status=status, by_peer=True)]
            case SettingsFrame(settings=settings, clear=clear):
                return [SettingsReceived(settings=settings, clear=clear)]
            case PingFrame(ping_id=ping_id):
                if ping_id % 2 == self._parity:
                    if ping_id in self._pings:
                        self._pings.discard(ping_id)
                        return [PingAcknowledged(ping_id=ping_id)]
                    return []  # an echo of nothing this side sent: ignored, as SPDY/3 says
                self._send(frame)
                return [PingReceived(ping_id=ping_id)]
            case GoAwayFrame(last_good_stream_id=last, status=status):
                self.goaway_received = True
                return [GoAwayReceived(last_good_stream_id=last, status=status)]
            case WindowUpdateFrame(stream_id=sid, delta=delta):
                return [WindowUpdated(stream_id=sid, delta=delta)]
        raise AssertionError(f"unhandled frame {frame!r}")  # pragma: no cover

    def _on_syn_stream(self, frame: SynStreamFrame) -> list[Event]:
        sid = frame.stream_id
        if self._is_local(sid) or sid <= self._last_peer_stream_id:
            side = "odd" if self._parity == 0 else "even"
            raise RemoteProtocolError(
                f"SYN_STREAM for stream {sid}: the peer's stream ids are {side} and must increase"
                f" (last was {self._last_peer_stream_id})"
            )
        if self.goaway_sent:
            return []  # SPDY/3: after GOAWAY, new streams are ignored
        self._last_peer_stream_id = sid
        if len(self._streams) >= self.limits.max_streams:
            self._send(RstStreamFrame(stream_id=sid, status=REFUSED_STREAM))
            return []
        self._streams[sid] = _Stream(
            local_open=not frame.unidirectional, remote_open=not frame.fin, replied=False
        )
        self._forget_if_closed(sid)
        return [
            StreamOpened(
                stream_id=sid,
                headers=frame.headers,
                fin=frame.fin,
                unidirectional=frame.unidirectional,
                priority=frame.priority,
                associated_to=frame.associated_to,
            )
        ]

    def _half_close_remote(self, stream_id: int, stream: _Stream, fin: bool) -> None:
        if fin:
            stream.remote_open = False
            self._forget_if_closed(stream_id)
