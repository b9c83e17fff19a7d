"""The frame codec: round-trips under any chunking, hostile bytes only ever raise RemoteProtocolError,
memory stays bounded, and every limit fails with its documented code."""

from __future__ import annotations

import enum
import tracemalloc
from typing import Any

import attrs
import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wire import codec
from wire.codec import FrameDecoder, encode, encode_checked
from wire.errors import ErrorCode, LocalProtocolError, RemoteProtocolError
from wire.frames import (
    Accept,
    Data,
    Frame,
    FrameKind,
    GoAway,
    HalfClose,
    Hello,
    Notice,
    Open,
    Ping,
    Pong,
    Refuse,
    Reset,
    WindowUpdate,
)
from wire.settings import KiB, Limits, MiB

# ---------------------------------------------------------------------------------------------- strategies

stream_ids = st.integers(1, codec.MAX_STREAM_ID)
codes = st.integers(0, 2**32 - 1)
messages = st.text(max_size=40)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=30)
    | st.binary(max_size=30)
)
metadata_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
metadata = st.dictionaries(st.text(max_size=12), metadata_values, max_size=6)

frames: st.SearchStrategy[Frame] = st.one_of(
    st.builds(
        Hello,
        major=st.integers(0, 2**32 - 1),
        minor=st.integers(0, 2**32 - 1),
        settings=st.dictionaries(st.text(max_size=20), st.integers(0, 2**32), max_size=5),
        metadata=metadata,
    ),
    st.builds(Open, stream_id=stream_ids, metadata=metadata),
    st.builds(Accept, stream_id=stream_ids, metadata=metadata),
    st.builds(Refuse, stream_id=stream_ids, code=codes, message=messages),
    st.builds(Data, stream_id=stream_ids, payload=st.binary(max_size=300)),
    st.builds(WindowUpdate, stream_id=stream_ids, increment=st.integers(1, 2**31 - 1)),
    st.builds(HalfClose, stream_id=stream_ids),
    st.builds(Reset, stream_id=stream_ids, code=codes, message=messages),
    st.builds(Ping, opaque=st.integers(0, 2**64 - 1)),
    st.builds(Pong, opaque=st.integers(0, 2**64 - 1)),
    st.builds(
        GoAway, last_stream_id=st.integers(0, codec.MAX_STREAM_ID), code=codes, message=messages
    ),
    st.builds(Notice, metadata=metadata),
)


def feed_in_chunks(decoder: FrameDecoder, data: bytes, cuts: list[int]) -> list[Frame]:
    out: list[Frame] = []
    start = 0
    for cut in [*sorted(cuts), len(data)]:
        out += decoder.feed(data[start:cut])
        start = cut
    return out


def decode_error(data: bytes, limits: Limits | None = None) -> RemoteProtocolError:
    with pytest.raises(RemoteProtocolError) as info:
        FrameDecoder(limits).feed(data)
    return info.value


def pack(obj: Any) -> bytes:
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return data


# ---------------------------------------------------------------------------------------------- round trips


@given(frame=frames)
def test_every_frame_kind_round_trips(frame: Frame) -> None:
    assert FrameDecoder().feed(encode(frame)) == [frame]


def test_the_strategy_covers_every_kind() -> None:
    seen: set[FrameKind] = set()

    @given(frame=frames)
    @settings(max_examples=300)
    def collect(frame: Frame) -> None:
        seen.add(frame.kind)

    collect()
    assert seen == set(FrameKind)


@given(batch=st.lists(frames, max_size=12), data=st.data())
@settings(max_examples=120)
def test_round_trip_under_any_chunking(batch: list[Frame], data: st.DataObject) -> None:
    stream = b"".join(encode(f) for f in batch)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=40), label="cuts")
    assert feed_in_chunks(FrameDecoder(), stream, cuts) == batch


def test_round_trip_byte_by_byte_and_all_at_once() -> None:
    batch: list[Frame] = [
        Hello(major=1, minor=0, settings={"initial_window": 262144}, metadata={"agent": 7}),
        Open(stream_id=1, metadata={"method": "GET", "headers": [["accept", "*/*"]]}),
        Data(stream_id=1, payload=b"x" * 70000),
        HalfClose(stream_id=1),
    ]
    stream = b"".join(encode(f) for f in batch)
    limits = Limits(max_frame_payload=128 * KiB)
    assert FrameDecoder(limits).feed(stream) == batch
    decoder = FrameDecoder(limits)
    out: list[Frame] = []
    for i in range(len(stream)):
        out += decoder.feed(stream[i : i + 1])
    assert out == batch


def test_largest_legal_frames_pass_in_one_feed_and_split() -> None:
    limits = Limits()
    data = encode(Data(stream_id=codec.MAX_STREAM_ID, payload=b"\xff" * limits.max_frame_payload))
    # Many largest frames at once: the decoder slices big feeds so its buffer never overflows.
    assert len(FrameDecoder(limits).feed(data * 5)) == 5
    decoder = FrameDecoder(limits)
    assert decoder.feed(data[:-1]) == []
    assert len(decoder.feed(data[-1:] + data)) == 2


# ---------------------------------------------------------------------------------------------- hostile bytes


def only_protocol_errors(data: bytes, cuts: list[int], limits: Limits | None = None) -> None:
    try:
        feed_in_chunks(FrameDecoder(limits), data, cuts)
    except RemoteProtocolError as exc:
        assert exc.code in (ErrorCode.PROTOCOL_ERROR, ErrorCode.FRAME_SIZE_ERROR)


@given(junk=st.binary(max_size=400), data=st.data())
@settings(max_examples=500)
def test_random_bytes_raise_only_remote_protocol_error(junk: bytes, data: st.DataObject) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(junk)), max_size=8))
    only_protocol_errors(junk, cuts)


small_limits = Limits(
    max_frame_payload=64,
    max_control_frame=160,
    max_string=32,
    max_map_entries=4,
    max_array_items=4,
    max_depth=3,
)


@st.composite
def mutated_streams(draw: st.DrawFn) -> bytes:
    stream = bytearray(b"".join(encode(f) for f in draw(st.lists(frames, min_size=1, max_size=4))))
    for _ in range(draw(st.integers(1, 4))):
        how = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "splice", "set"]))
        pos = draw(st.integers(0, max(len(stream) - 1, 0)))
        if how == "flip" and stream:
            stream[pos] ^= 1 << draw(st.integers(0, 7))
        elif how == "truncate":
            del stream[pos:]
        elif how == "insert":
            stream[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif how == "delete":
            del stream[pos : pos + draw(st.integers(1, 8))]
        elif how == "splice":
            other = encode(draw(frames))
            stream[pos:pos] = other[draw(st.integers(0, len(other))) :]
        elif how == "set" and stream:
            # msgpack type bytes that claim huge sizes or exotic types
            stream[pos] = draw(
                st.sampled_from([0xC1, 0xC4, 0xC5, 0xC6, 0xC7, 0xD4, 0xD9, 0xDB, 0xDC, 0xDD, 0xDF])
            )
    return bytes(stream)


@given(stream=mutated_streams(), data=st.data(), tight=st.booleans())
@settings(max_examples=250, suppress_health_check=[HealthCheck.too_slow])
def test_mutated_frames_raise_only_remote_protocol_error(
    stream: bytes, data: st.DataObject, tight: bool
) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=6))
    only_protocol_errors(stream, cuts, small_limits if tight else None)


@given(
    obj=st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=6)
            | st.dictionaries(scalars.filter(lambda v: isinstance(v, str)), inner, max_size=4)
        ),
        max_leaves=20,
    )
)
def test_well_formed_msgpack_that_is_no_frame_raises_protocol_error(obj: object) -> None:
    try:
        frames_out = FrameDecoder().feed(pack(obj))
    except RemoteProtocolError as exc:
        assert exc.code in (ErrorCode.PROTOCOL_ERROR, ErrorCode.FRAME_SIZE_ERROR)
    else:  # a random object that happens to be a valid frame must re-encode to itself
        assert [FrameDecoder().feed(encode(f))[0] for f in frames_out] == frames_out


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("not an array", pack({"kind": 4})),
        ("empty array", pack([])),
        ("kind not an int", pack(["DATA", 1, b""])),
        ("kind is a bool", pack([True, 1])),
        ("unknown kind", pack([11, 1])),
        ("negative kind", pack([-1, 1])),
        ("missing field", pack([4, 1])),
        ("extra field", pack([6, 1, 2])),
        ("stream id 0", pack([6, 0])),
        ("stream id past 2**31-1", pack([6, 2**31])),
        ("negative stream id", pack([6, -1])),
        ("stream id a float", pack([6, 1.0])),
        ("payload a str", pack([4, 1, "text"])),
        ("window increment 0", pack([5, 1, 0])),
        ("window increment past 2**31-1", pack([5, 1, 2**31])),
        ("metadata not a map", pack([1, 1, [1, 2]])),
        ("metadata key bytes", pack([1, 1, {b"k": 1}])),
        ("metadata key int", b"\x93\x01\x01\x81\x01\x01"),
        ("nested key int", pack([1, 1, {"a": {"b": 1}}]).replace(b"\xa1b", b"\x07")),
        ("code negative", pack([7, 1, -1, ""])),
        ("code past 2**32-1", pack([7, 1, 2**32, ""])),
        ("message bytes", pack([7, 1, 0, b"m"])),
        ("goaway last id negative", pack([10, -1, 0, ""])),
        ("ping opaque negative", pack([8, -1])),
        ("hello settings not a map", pack([0, 1, 0, [], {}])),
        ("hello version negative", pack([0, -1, 0, {}, {}])),
        ("invalid utf-8", b"\x94\x07\x01\x00\xa1\xff"),
        ("reserved byte 0xc1", b"\x92\x08\xc1"),
        ("ext type", b"\x92\x08\xd4\x01\x01"),
        ("empty ext", b"\x92\x08\xc7\x00\x01"),
        ("timestamp ext", pack([8, msgpack.Timestamp(1, 0)])),
    ],
)
def test_malformed_frames_are_protocol_errors(name: str, data: bytes) -> None:
    assert decode_error(data).code is ErrorCode.PROTOCOL_ERROR, name


def test_decoder_reports_frames_only_when_whole() -> None:
    data = encode(Ping(opaque=2**64 - 1))
    decoder = FrameDecoder()
    assert decoder.feed(data[:3]) == []
    assert decoder.feed(b"") == []
    assert decoder.feed(data[3:]) == [Ping(opaque=2**64 - 1)]


# ---------------------------------------------------------------------------------------------- limits
# Exceeding a limit is FRAME_SIZE_ERROR; a malformed frame within the limits is PROTOCOL_ERROR.

LIMITS = Limits(
    max_frame_payload=100,
    max_control_frame=200,
    max_string=50,
    max_map_entries=4,
    max_array_items=4,
    max_depth=3,
)


def check_limit(at_limit: Frame, over_limit: Frame) -> None:
    assert FrameDecoder(LIMITS).feed(encode(at_limit)) == [at_limit]
    assert decode_error(encode(over_limit), LIMITS).code is ErrorCode.FRAME_SIZE_ERROR
    # A sender holds itself to the same limits: nothing over them leaves encode_checked.
    assert encode_checked(at_limit, LIMITS) == encode(at_limit)
    with pytest.raises(LocalProtocolError) as info:
        encode_checked(over_limit, LIMITS)
    assert info.value.code is ErrorCode.FRAME_SIZE_ERROR


def test_limit_frame_payload() -> None:
    check_limit(Data(stream_id=1, payload=b"p" * 100), Data(stream_id=1, payload=b"p" * 101))


def test_limit_string_length_in_metadata_and_messages() -> None:
    check_limit(
        Open(stream_id=1, metadata={"k": "s" * 50}), Open(stream_id=1, metadata={"k": "s" * 51})
    )
    check_limit(
        Open(stream_id=1, metadata={"k" * 50: 1}), Open(stream_id=1, metadata={"k" * 51: 1})
    )
    check_limit(
        Reset(stream_id=1, code=1, message="m" * 50), Reset(stream_id=1, code=1, message="m" * 51)
    )
    # the limit counts UTF-8 bytes, not characters
    check_limit(
        Open(stream_id=1, metadata={"k": "é" * 25}),
        Open(stream_id=1, metadata={"k": "é" * 25 + "e"}),
    )


def test_limit_map_entries() -> None:
    four = {str(i): i for i in range(4)}
    check_limit(Open(stream_id=1, metadata=four), Open(stream_id=1, metadata={**four, "4": 4}))
    check_limit(
        Open(stream_id=1, metadata={"m": four}), Open(stream_id=1, metadata={"m": {**four, "4": 4}})
    )


def test_limit_array_items() -> None:
    check_limit(
        Accept(stream_id=1, metadata={"a": [1, 2, 3, 4]}),
        Accept(stream_id=1, metadata={"a": [1, 2, 3, 4, 5]}),
    )


def test_limit_depth_counts_the_metadata_map_itself() -> None:
    check_limit(
        Open(stream_id=1, metadata={"a": {"b": {}}}),
        Open(stream_id=1, metadata={"a": {"b": {"c": {}}}}),
    )
    check_limit(Open(stream_id=1, metadata={"a": [[]]}), Open(stream_id=1, metadata={"a": [[[]]]}))


def test_limit_depth_far_past_msgpacks_own_stack() -> None:
    assert (
        decode_error(b"\x93\x01\x01\x81\xa1a" + b"\x91" * 5000).code is ErrorCode.FRAME_SIZE_ERROR
    )


def test_limit_control_frame_size() -> None:
    # every string and map is within its own limit; only the frame as a whole is too big
    def meta(n: int) -> dict[str, Any]:
        return {"a": "x" * 50, "b": "x" * 50, "c": "x" * 50, "d": "x" * n}

    at = Open(stream_id=1, metadata=meta(0))
    at = Open(stream_id=1, metadata=meta(200 - len(encode(at))))
    assert len(encode(at)) == 200
    check_limit(
        at, Open(stream_id=1, metadata=meta(201 - len(encode(Open(stream_id=1, metadata=meta(0))))))
    )


def test_limit_control_frame_size_applies_to_hello_too() -> None:
    big = Hello(major=1, minor=0, settings={}, metadata={str(i): "v" * 45 for i in range(4)})
    assert len(encode(big)) > 200
    assert decode_error(encode(big), LIMITS).code is ErrorCode.FRAME_SIZE_ERROR


def test_huge_map_and_array_claims_fail_at_their_header() -> None:
    # a 4-billion-entry map or 4-billion-item array: rejected from a few header bytes
    assert decode_error(b"\x93\x01\x01\xdf\xff\xff\xff\xff").code is ErrorCode.FRAME_SIZE_ERROR
    assert (
        decode_error(b"\x93\x01\x01\x81\xa1k\xdd\xff\xff\xff\xff").code
        is ErrorCode.FRAME_SIZE_ERROR
    )


@pytest.mark.parametrize("size", [Limits().max_frame_payload + 1, 2**32 - 1])
def test_bin_claims_fail_once_the_buffered_frame_outgrows_the_limit(size: int) -> None:
    limits = Limits()
    decoder = FrameDecoder(limits)
    assert decoder.feed(b"\x93\x04\x01\xc6" + size.to_bytes(4, "big")) == []
    fed = 0
    with pytest.raises(RemoteProtocolError) as info:
        while fed < 4 * limits.max_frame_bytes:
            fed += 4096
            decoder.feed(b"\0" * 4096)
    assert info.value.code is ErrorCode.FRAME_SIZE_ERROR
    assert fed <= 2 * limits.max_frame_bytes


def test_a_frame_of_many_small_parts_is_stopped_by_its_running_size() -> None:
    # 256 strings of 16 KiB: each part is legal and leaves the buffer once parsed, so only the
    # running size of the partial frame can stop it.
    body = b"".join(pack(f"{i:03}") + pack("s" * (16 * KiB - 1)) for i in range(256))
    data = b"\x93\x01\x01\xde\x01\x00" + body
    decoder = FrameDecoder()
    with pytest.raises(RemoteProtocolError) as info:
        for i in range(0, len(data), 1000):
            decoder.feed(data[i : i + 1000])
    assert info.value.code is ErrorCode.FRAME_SIZE_ERROR
    assert i < 2 * Limits().max_frame_bytes


def test_bounded_memory_under_hostile_claims() -> None:
    limits = Limits()
    bound = 2 * limits.max_frame_bytes
    ten_mib = 10 * MiB
    attacks = {
        "10 MiB bin": b"\x93\x04\x01\xc6" + ten_mib.to_bytes(4, "big") + b"\0" * ten_mib,
        "10 MiB str": b"\x93\x01\x01\x81\xa1k\xdb" + ten_mib.to_bytes(4, "big") + b"s" * ten_mib,
        "huge map": b"\x93\x01\x01\xdf\xff\xff\xff\xff" + b"\xa1k\x01" * 100_000,
        "huge array": b"\x93\x01\x01\x81\xa1k\xdd\xff\xff\xff\xff" + b"\x01" * 100_000,
        "deep maps": b"\x93\x01\x01" + b"\x81\xa1k" * 100_000,
        "deep arrays": b"\x93\x01\x01\x81\xa1k" + b"\x91" * 100_000,
        "endless strings": b"\x93\x01\x01\x81\xa1k\xdc\x01\x00"
        + (b"\xda\x3f\xff" + b"s" * 0x3FFF) * 600,
    }
    for name, data in attacks.items():
        for chunk in (1_000, 64 * KiB, len(data)):
            tracemalloc.start()
            try:
                decoder = FrameDecoder(limits)
                _, constructed = tracemalloc.get_traced_memory()
                tracemalloc.reset_peak()
                view = memoryview(data)
                with pytest.raises(RemoteProtocolError) as info:
                    for i in range(0, len(data), chunk):
                        decoder.feed(view[i : i + chunk])
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert info.value.code is ErrorCode.FRAME_SIZE_ERROR, name
            # An idle decoder holds almost nothing; the unpacker (parse stack plus a buffer of at most
            # one partial frame and one slice) exists only while a frame is partly received, and
            # hostile bytes never push the decoder's total past twice the frame bound.
            assert constructed <= 4 * KiB, name
            assert peak <= 2 * bound, (name, chunk, peak)


def test_decoder_counts_bytes_of_any_buffer() -> None:
    data = encode(Data(stream_id=1, payload=b"abcd")) + b"\x92"  # a frame and the start of a PING
    assert len(data) == 10
    decoder = FrameDecoder()
    assert decoder.feed(memoryview(data).cast("H")) == [Data(stream_id=1, payload=b"abcd")]
    assert decoder.feed(b"\x08\x01") == [Ping(opaque=1)]


# DATA frames take a fast path (cut straight out of the input); it must accept and reject exactly
# what the general msgpack decoder does, whatever valid encoding the peer chose.
_INT_ENCODINGS = {
    "fixint": lambda v: bytes([v]) if v <= 0x7F else None,
    "uint8": lambda v: b"\xcc" + v.to_bytes(1, "big") if v <= 0xFF else None,
    "uint16": lambda v: b"\xcd" + v.to_bytes(2, "big") if v <= 0xFFFF else None,
    "uint32": lambda v: b"\xce" + v.to_bytes(4, "big"),
    "uint64": lambda v: b"\xcf" + v.to_bytes(8, "big"),
    "int32": lambda v: b"\xd2" + v.to_bytes(4, "big", signed=True) if v < 2**31 else None,
    "int64": lambda v: b"\xd3" + v.to_bytes(8, "big", signed=True),
}
_BIN_ENCODINGS = {"bin8": (b"\xc4", 1), "bin16": (b"\xc5", 2), "bin32": (b"\xc6", 4)}


def _data_frame(stream_id: int, payload: bytes, id_form: str, bin_form: str) -> bytes | None:
    sid = _INT_ENCODINGS[id_form](stream_id)
    marker, width = _BIN_ENCODINGS[bin_form]
    if sid is None or len(payload) >= 1 << (8 * width):
        return None
    return b"\x93\x04" + sid + marker + len(payload).to_bytes(width, "big") + payload


@given(
    parts=st.lists(
        st.tuples(
            st.integers(0, 2**32 - 1),  # 0 and ids past 2**31-1 are protocol errors
            st.binary(max_size=140),  # the limit below is 100 bytes
            st.sampled_from(sorted(_INT_ENCODINGS)),
            st.sampled_from(sorted(_BIN_ENCODINGS)),
        ),
        min_size=1,
        max_size=6,
    ),
    tail=st.sampled_from([b"", encode(Ping(opaque=7)), encode(HalfClose(stream_id=3))]),
    split=st.integers(0, 2000),
)
@settings(max_examples=400)
def test_data_fast_path_agrees_with_msgpack(parts: list[tuple[int, bytes, str, str]], tail: bytes, split: int) -> None:
    stream = b"".join(frame for frame in (_data_frame(*part) for part in parts) if frame is not None) + tail

    def general(data: bytes) -> list[Frame] | ErrorCode:
        # The reference: msgpack's own streaming unpacker and the same validation, frame by frame.
        unpacker = msgpack.Unpacker(**codec._unpack_kwargs(LIMITS))
        unpacker.feed(data)
        frames: list[Frame] = []
        try:
            for obj in unpacker:
                frames.append(codec._validate(obj, 0, LIMITS))
        except RemoteProtocolError as exc:
            return exc.code
        except ValueError:  # msgpack's max_bin_len
            return ErrorCode.FRAME_SIZE_ERROR
        return frames

    def fast(*chunks: bytes) -> list[Frame] | ErrorCode:
        decoder = FrameDecoder(LIMITS)
        frames: list[Frame] = []
        try:
            for chunk in chunks:
                frames.extend(decoder.feed(chunk))
        except RemoteProtocolError as exc:
            return exc.code
        return frames

    expected = general(stream)
    assert fast(stream) == expected
    cut = split % (len(stream) + 1)
    assert fast(stream[:cut], stream[cut:]) == expected


@given(stream_id=st.integers(1, 2**31 - 1), size=st.sampled_from([0, 1, 127, 255, 256, 65535, 65536, 70000]))
def test_data_header_is_msgpacks_own_encoding(stream_id: int, size: int) -> None:
    payload = b"x" * size
    assert codec.data_header(stream_id, size) + payload == msgpack.packb([4, stream_id, payload], use_bin_type=True)


class _Code(enum.IntEnum):
    NINE = 9


class _Text(str):
    pass


# Frames within LIMITS but for one value at the edge of a limit (just under, at, just over), of the
# types the decoder returns or of ones it does not that msgpack still packs (an IntEnum as an int,
# a bytearray as bin, a tuple as an array, a str subclass). One edge per frame, so that no other
# violation hides the one under test.
_small = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=5) | st.binary(max_size=5),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=3), inner, max_size=2),
    max_leaves=4,
)


def _nested(depth: int, container: str) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value] if container == "list" else {"d": value}
    return value


# strings whose UTF-8 bytes are just under, at or over LIMITS.max_string (50)
_edge_text = st.builds(lambda n, c: c * n, st.sampled_from([12, 13, 25, 26, 49, 50, 51]), st.sampled_from("aé€😀"))
_edge_value = st.one_of(
    _edge_text,
    st.builds(lambda n: b"b" * n, st.sampled_from([99, 100, 101])),
    st.builds(lambda n: [0] * n, st.sampled_from([4, 5])),
    st.builds(lambda n: tuple(range(n)), st.sampled_from([4, 5])),
    st.builds(lambda n: {str(i): i for i in range(n)}, st.sampled_from([4, 5])),
    st.builds(_nested, st.sampled_from([1, 2, 3]), st.sampled_from(["list", "dict"])),
    st.sampled_from([_Code.NINE, _Text("t"), bytearray(b"ba"), {b"bin-key": 1}, {7: 1}]),
    st.builds(lambda n: _Text("x" * n), st.sampled_from([50, 51])),
)


@st.composite
def _edge_maps(draw: st.DrawFn) -> dict[str, object]:
    base = draw(st.dictionaries(st.text(max_size=4), _small, max_size=2))
    key = draw(st.text(max_size=4) | _edge_text)
    edge = draw(_edge_value)
    if draw(st.booleans()):
        base[key] = edge  # at the top
    else:
        base[key] = [edge]  # one level down
    return base


_sendable = st.one_of(
    st.builds(Open, stream_id=st.integers(0, 3) | st.just(codec.MAX_STREAM_ID + 1), metadata=_edge_maps()),
    st.builds(Accept, stream_id=stream_ids, metadata=_edge_maps()),
    st.builds(Hello, major=st.integers(0, 3), minor=st.integers(0, 3), settings=_edge_maps(), metadata=st.just({})),
)


#: LIMITS with room for whole frames, so that the per-value limits decide
ROOMY = attrs.evolve(LIMITS, max_control_frame=4096)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(_sendable, st.sampled_from([ROOMY, LIMITS]))
def test_encode_checked_refuses_exactly_what_the_peer_would(frame: Frame, limits: Limits) -> None:
    # encode_checked judges the values without decoding them; the peer decodes. Same verdict.
    try:
        data = encode(frame)
    except (TypeError, ValueError, OverflowError):
        with pytest.raises(LocalProtocolError):
            encode_checked(frame, limits)
        return
    try:
        FrameDecoder(limits).feed(data)
        peer_accepts = True
    except RemoteProtocolError:
        peer_accepts = False
    try:
        assert encode_checked(frame, limits) == data
        we_send = True
    except LocalProtocolError:
        we_send = False
    assert we_send == peer_accepts


# ---------------------------------------------------------------------------------------------- bulk DATA


def _bulk() -> tuple[list[Frame], bytes, list[int]]:
    frames: list[Frame] = [Data(stream_id=sid, payload=bytes([sid % 251]) * size)
                           for sid, size in ((1, 64 * KiB), (3, 0), (300, 70), (70_000, 5000), (codec.MAX_STREAM_ID, 64 * KiB))]
    encoded = [encode(f) for f in frames]
    starts = [sum(len(e) for e in encoded[:i]) for i in range(len(encoded))]
    return frames, b"".join(encoded), starts


def test_data_frames_cut_anywhere_never_take_the_general_decoder(monkeypatch: pytest.MonkeyPatch) -> None:
    # A bulk transfer's reads cut DATA frames anywhere, in the header too: each such frame used to
    # make a msgpack unpacker (~40 KiB, and a copy of every byte through its buffer) that then
    # decoded the rest of the read and often the next ones.
    made: list[object] = []
    real = msgpack.Unpacker

    def counted(*args: Any, **kwargs: Any) -> msgpack.Unpacker:
        made.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(msgpack, "Unpacker", counted)
    frames, stream, starts = _bulk()
    cuttings = [[start + k] for start in starts for k in range(14)]
    cuttings += [list(range(0, len(stream), size)) for size in (1000, 4096, 65536 + 7, 100_000)]
    cuttings.append([5, 6, 7, 9, 11, 20, 4096, 70_000, 70_003])
    for cuts in cuttings:
        assert feed_in_chunks(FrameDecoder(), stream, cuts) == frames, cuts
    assert not made


def test_a_data_frame_fed_in_tiny_pieces_holds_little_more_than_its_payload() -> None:
    frames, stream, _ = _bulk()
    small = encode(Data(stream_id=5, payload=b"s" * 8 * KiB))
    for chunk, big, source in ((1, small, small), (1000, encode(frames[0]), encode(frames[0])),
                               (5000, encode(frames[0]), encode(frames[0]) * 8)):
        tracemalloc.start()
        try:
            decoder = FrameDecoder()
            tracemalloc.reset_peak()
            view = memoryview(source)
            out: list[Frame] = []
            for i in range(0, len(big) - 1, chunk):  # all of it but its last byte: still partial
                out += decoder.feed(view[i : min(i + chunk, len(big) - 1)])
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert out == []
        assert peak <= len(big) + 16 * KiB, (chunk, peak)
        assert decoder.feed(big[-1:] + stream) == [FrameDecoder().feed(big)[0], *frames]
