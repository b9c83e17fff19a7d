"""The frame-header scanner and the reset bucket (``h2trio.budget``), sans I/O: whatever the reads'
boundaries, the scanner sees the same frames and stops at the same header, before its body."""

from __future__ import annotations

import struct

import h2.errors
import h2.exceptions
import hyperframe.frame as hf
import pytest
from hypothesis import given
from hypothesis import strategies as st

from h2trio.budget import (
    HEADER_BLOCK_SLACK,
    PREFACE,
    BudgetExceededError,
    FrameScanner,
    ResetBucket,
    ResetBuckets,
    ResetLimit,
)

KiB = 1024


def _header(kind: int, length: int, flags: int = 0, stream_id: int = 1) -> bytes:
    return struct.pack(">HBBBL", length >> 8, length & 0xFF, kind, flags, stream_id)


def _data(length: int, stream_id: int = 1) -> bytes:
    return hf.DataFrame(stream_id, data=b"d" * length).serialize()


def _settings_ack() -> bytes:
    return hf.SettingsFrame(0, flags=["ACK"]).serialize()


def _scanner(*, server: bool = True, header_list: int = 16 * KiB) -> FrameScanner:
    scanner = FrameScanner(server=server, header_block_limit=header_list + HEADER_BLOCK_SLACK)
    scanner.settings_sent(16384)  # the connection's first SETTINGS
    return scanner


def _feed_in_pieces(scanner: FrameScanner, data: bytes, cuts: list[int]) -> list[int]:
    """Feed ``data`` cut at ``cuts``; the split offsets, as positions in the whole of ``data``."""
    splits: list[int] = []
    start = 0
    for end in [*sorted(set(cuts)), len(data)]:
        splits.extend(start + offset for offset in scanner.feed(data[start:end]))
        start = end
    return splits


def _where_it_fails(scanner: FrameScanner, data: bytes, cuts: list[int]) -> tuple[int, str] | None:
    """How many bytes were fed when the scanner raised (and what), or None."""
    start = 0
    for end in [*sorted(set(cuts)), len(data)]:
        try:
            scanner.feed(data[start:end])
        except BudgetExceededError as exc:
            return end, str(exc)
        start = end
    return None


# --------------------------------------------------------------------------- frame size


def test_an_oversize_frame_is_refused_from_its_nine_byte_header() -> None:
    scanner = _scanner()
    scanner.feed(PREFACE + _data(16384))  # the largest allowed frame passes
    with pytest.raises(BudgetExceededError, match="16385 bytes announced") as info:
        scanner.feed(_header(0x0, 16385))
    assert info.value.error_code == h2.errors.ErrorCodes.FRAME_SIZE_ERROR


def test_a_raised_limit_applies_from_the_peers_settings_ack_on() -> None:
    scanner = _scanner()
    scanner.settings_sent(1 << 20)  # the agent port, once the tunnel was accepted
    first = PREFACE + _settings_ack()  # acknowledges the first SETTINGS: the limit stays 16 KiB
    second = _settings_ack()
    splits = scanner.feed(first + second + _data(1 << 20))
    assert scanner.max_frame_size == 1 << 20 and scanner.settings_unacknowledged == 0
    # h2 must be fed up to the end of the ACK that raised the limit, then the rest
    assert splits == (len(first) + len(second),)


def test_before_the_ack_the_old_limit_holds() -> None:
    scanner = _scanner()
    scanner.settings_sent(1 << 20)
    with pytest.raises(BudgetExceededError):
        scanner.feed(PREFACE + _settings_ack() + _header(0x0, 20000))


def test_settings_that_keep_the_frame_size_need_no_split() -> None:
    scanner = _scanner()
    scanner.settings_sent()  # e.g. only INITIAL_WINDOW_SIZE changed
    assert scanner.feed(PREFACE + _settings_ack() + _settings_ack() + _data(100)) == ()
    assert scanner.settings_unacknowledged == 0


def test_a_wrong_preface_is_a_protocol_error() -> None:
    scanner = _scanner()
    scanner.feed(PREFACE[:10])
    with pytest.raises(h2.exceptions.ProtocolError, match="preamble"):
        scanner.feed(b"GET / HTTP/1.1\r\n")


def test_a_client_side_scanner_expects_no_preface() -> None:
    scanner = _scanner(server=False)
    assert scanner.feed(_data(16384) + _settings_ack()) == ()


# --------------------------------------------------------------------------- header blocks


def test_a_header_block_is_capped_across_continuation_frames() -> None:
    scanner = _scanner(header_list=16 * KiB)
    scanner.feed(PREFACE)
    scanner.feed(_header(0x1, 10000, flags=0x1))  # HEADERS, END_STREAM, no END_HEADERS
    scanner.feed(b"h" * 10000)
    scanner.feed(_header(0x9, 7000) + b"c" * 7000)  # 17,000: within 16 KiB + slack
    with pytest.raises(BudgetExceededError, match="header block over") as info:
        scanner.feed(_header(0x9, 1000))
    assert info.value.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM


def test_a_finished_header_block_does_not_count_toward_the_next() -> None:
    scanner = _scanner(header_list=16 * KiB)
    scanner.feed(PREFACE)
    for stream_id in range(1, 41, 2):
        scanner.feed(_header(0x1, 9000, stream_id=stream_id) + b"h" * 9000)
        scanner.feed(_header(0x9, 8000, flags=0x4, stream_id=stream_id) + b"c" * 8000)  # END_HEADERS
    scanner.feed(_header(0x1, 16000, flags=0x4, stream_id=41) + b"h" * 16000)


def test_push_promise_blocks_are_capped_too() -> None:
    scanner = _scanner(server=False, header_list=4 * KiB)
    scanner.feed(_header(0x5, 4000, stream_id=1) + b"p" * 4000)
    with pytest.raises(BudgetExceededError):
        scanner.feed(_header(0x9, 2000, stream_id=1))


# --------------------------------------------------------------------------- any chunking


def _stream_of_frames(sizes: list[int]) -> bytes:
    """A server's view: preface, then DATA frames and complete header blocks of these sizes."""
    out = [PREFACE]
    for i, size in enumerate(sizes):
        if i % 3 == 2:
            out.append(_header(0x1, size // 2, stream_id=2 * i + 1) + b"h" * (size // 2))
            out.append(_header(0x9, size - size // 2, flags=0x4, stream_id=2 * i + 1) + b"c" * (size - size // 2))
        else:
            out.append(_data(size))
    return b"".join(out)


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=16384), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=200_000), max_size=30),
)
def test_any_chunking_of_valid_frames_passes(sizes: list[int], cuts: list[int]) -> None:
    data = _stream_of_frames(sizes)
    scanner = _scanner()
    _feed_in_pieces(scanner, data, [c for c in cuts if c < len(data)])
    assert scanner._skip == 0 and scanner._partial == b""  # ends on a frame boundary


@given(
    before=st.lists(st.integers(min_value=0, max_value=16384), max_size=5),
    oversize=st.integers(min_value=16385, max_value=(1 << 24) - 1),
    cuts=st.lists(st.integers(min_value=0, max_value=100_000), max_size=20),
)
def test_any_chunking_stops_at_the_oversize_header_before_its_body(
    before: list[int], oversize: int, cuts: list[int]
) -> None:
    valid = _stream_of_frames(before)
    data = valid + _header(0x0, oversize) + b"b" * 50
    failed = _where_it_fails(_scanner(), data, [c for c in cuts if c < len(data)])
    assert failed is not None
    fed, message = failed
    assert f"{oversize} bytes" in message
    # the read that completed the bad header is the one that fails: no body byte was waited for
    assert fed >= len(valid) + 9
    assert not any(len(valid) + 9 <= c < fed for c in cuts)


@given(
    cuts=st.lists(st.integers(min_value=0, max_value=(1 << 20) + 200), max_size=20),
)
def test_any_chunking_finds_the_settings_ack_that_raises_the_limit(cuts: list[int]) -> None:
    head = PREFACE + _settings_ack() + _data(1000)
    ack = _settings_ack()
    data = head + ack + _data(1 << 20) + _data(5)
    scanner = _scanner()
    scanner.settings_sent(1 << 20)
    splits = _feed_in_pieces(scanner, data, [c for c in cuts if c < len(data)])
    assert splits == [len(head) + len(ack)]
    assert scanner.max_frame_size == 1 << 20


# --------------------------------------------------------------------------- the reset bucket


def test_the_reset_bucket_allows_its_budget_then_refills_over_the_window() -> None:
    bucket = ResetBucket(ResetLimit(budget=200, window=30.0), now=0.0)
    assert all(bucket.spend(1.0) for _ in range(200))
    assert not bucket.spend(1.0)
    assert not bucket.spend(1.1)  # 0.1 s brings back 2/3 of a token
    assert bucket.spend(1.25)  # 0.25 s more: 5/3 tokens (200 per 30 s), one spent
    assert not bucket.spend(1.25)
    assert all(bucket.spend(100.0) for _ in range(200))  # full again, never beyond the budget
    assert not bucket.spend(100.0)


def test_a_steady_rate_under_the_limit_never_runs_out() -> None:
    bucket = ResetBucket(ResetLimit(budget=10, window=10.0), now=0.0)
    assert all(bucket.spend(t * 1.01) for t in range(1000))  # one a second, just under the rate


def _rst(stream_id: int) -> bytes:
    return _header(0x3, 4, stream_id=stream_id) + b"\0\0\0\x08"


def test_a_read_with_more_resets_than_allowed_is_cut_just_past_the_one_beyond() -> None:
    scanner = _scanner(server=False)
    pairs = b"".join(_data(10, 2 * i + 1) + _rst(2 * i + 1) for i in range(10))
    pair = len(_data(10)) + len(_rst(1))
    assert scanner.feed(pairs, resets_allowed=3) == (4 * pair,)
    assert scanner.reset_cut == 4 * pair
    assert scanner.feed(pairs, resets_allowed=10) == ()
    assert scanner.reset_cut is None
    assert scanner.feed(pairs) == ()  # no budget given: nothing counted
    assert scanner.reset_cut is None


def test_no_cut_when_the_reset_beyond_the_budget_ends_the_read() -> None:
    scanner = _scanner(server=False)
    assert scanner.feed(_data(10) + _rst(1), resets_allowed=0) == ()
    assert scanner.reset_cut is None


def test_sources_share_a_reset_bucket_and_the_table_is_bounded() -> None:
    buckets = ResetBuckets(ResetLimit(budget=2, window=10.0), max_sources=3)
    first = buckets.bucket("10.0.0.1", 0.0)
    assert first.spend(0.0) and first.spend(0.0) and not first.spend(0.0)
    assert buckets.bucket("10.0.0.1", 1.0) is first  # a new connection finds the spent bucket
    assert buckets.bucket("10.0.0.1", 1.0).available(1.0) == 0
    assert buckets.bucket("10.0.0.2", 1.0).available(1.0) == 2
    buckets.bucket("10.0.0.3", 1.0)
    buckets.bucket("10.0.0.4", 1.0)  # full: refilled buckets (…2, …3) make room, not …1's
    assert len(buckets) <= 3
    assert buckets.bucket("10.0.0.1", 1.0) is first


def test_a_source_is_barred_once_its_bucket_ran_out_three_times_within_the_window() -> None:
    buckets = ResetBuckets(ResetLimit(budget=2, window=10.0))
    bucket = buckets.bucket("10.0.0.1", 0.0)
    assert bucket.spend(0.0) and bucket.spend(0.0)
    for _ in range(3):
        assert not buckets.barred("10.0.0.1", 0.0)
        assert not bucket.spend(0.0)  # a GOAWAY
    assert buckets.barred("10.0.0.1", 0.1)
    assert not buckets.barred("10.0.0.2", 0.1)  # unknown: nothing to hold against it
    assert not buckets.barred("10.0.0.1", 5.0)  # a token came back (2 per 10 s)
