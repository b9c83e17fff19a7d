"""What an HTTP/2 peer may cost this side, checked before h2 buffers anything: the frame-header
scanner (``FrameScanner``) and the stream-reset bucket (``ResetBucket``). No I/O, no clock (time is
an argument), so both are tested synchronously.

h2 buffers a frame's whole body before it checks the frame's length, and keeps the frames of an
unfinished header block (HEADERS or PUSH_PROMISE without END_HEADERS, then CONTINUATION) until the
block ends: a peer announcing a 16 MiB frame, or sending CONTINUATION after CONTINUATION, holds
that much of our memory before h2 objects. ``FrameScanner`` reads only the 9-byte frame headers as
bytes arrive, and raises ``BudgetExceededError`` as soon as a header announces a frame longer than
the SETTINGS_MAX_FRAME_SIZE in force, or a header block grows past its cap: before the body is read.

The limit in force is what the peer has acknowledged: we announce a new MAX_FRAME_SIZE in a SETTINGS
frame, and the peer may use it from its SETTINGS ACK on (RFC 9113, 6.5.3). The scanner sees the ACK
frames in the byte stream, so it knows exactly where the limit changes, and tells the driver
(``feed`` returns the offsets), which feeds h2 up to there first: h2 applies a new limit only when
a ``receive_data`` call starts.

``ResetBucket`` is a token bucket for streams the peer makes us set up for nothing (HTTP/2 rapid
reset, CVE-2023-44487): each stream it resets before the answer began, and each stream refused,
takes a token; tokens come back at ``budget / window`` per second up to ``budget``.
"""

from __future__ import annotations

import struct
from collections import deque

import attrs
import h2.errors
import h2.exceptions

__all__ = [
    "DEFAULT_RESET_LIMIT",
    "HEADER_BLOCK_SLACK",
    "PREFACE",
    "STRIKES",
    "BudgetExceededError",
    "FrameScanner",
    "ResetBucket",
    "ResetBuckets",
    "ResetLimit",
]

#: the client connection preface (RFC 9113, 3.4)
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#: the initial SETTINGS_MAX_FRAME_SIZE, until the peer acknowledges another (RFC 9113, 6.5.2)
DEFAULT_MAX_FRAME = 16384
#: bytes a header block may have beyond the advertised MAX_HEADER_LIST_SIZE. An HPACK-encoded field
#: is never longer than the 32 + name + value bytes the list size counts it as, so an honest block
#: exceeds the list size only by its padding (<= 256), a priority (5) and table size updates: a
#: block beyond this would fail h2's own (decoded) check anyway, after being held whole.
HEADER_BLOCK_SLACK = 1024

_HEADER = struct.Struct(">HBBBL")
_HEADERS, _RST_STREAM, _SETTINGS, _PUSH_PROMISE, _CONTINUATION = 0x1, 0x3, 0x4, 0x5, 0x9
_END_HEADERS = 0x4
_ACK = 0x1
_NO_SPLITS: tuple[int, ...] = ()


class BudgetExceededError(h2.exceptions.ProtocolError):
    """The peer went beyond what this side allows; ``error_code`` is the GOAWAY's."""

    def __init__(self, message: str, error_code: h2.errors.ErrorCodes) -> None:
        super().__init__(message)
        self.error_code = error_code


@attrs.frozen(kw_only=True)
class ResetLimit:
    """At most ``budget`` streams reset by the peer before their answer (or refused), refilled over
    ``window`` seconds: Netty's default for CVE-2023-44487 (200 RST_STREAM per 30 s)."""

    budget: int = 200
    window: float = 30.0


#: times a bucket must have run out within its window before its source is turned away at accept
STRIKES = 3

#: the default: Netty's (see ``ResetLimit``)
DEFAULT_RESET_LIMIT = ResetLimit()


class ResetBucket:
    """The token bucket of ``ResetLimit``; ``spend(now)`` is False once it is empty. It remembers
    when it last ran out (``emptied``: the last ``STRIKES`` times), which is how ``ResetBuckets``
    tells a source that keeps coming back for more from one that went over once."""

    __slots__ = ("_last", "_rate", "_tokens", "capacity", "emptied", "window")

    def __init__(self, limit: ResetLimit, now: float) -> None:
        self.capacity = float(limit.budget)
        self.window = limit.window
        self._rate = limit.budget / limit.window
        self._tokens = self.capacity
        self._last = now
        #: when ``spend`` last failed, the latest ``STRIKES`` times
        #: (None until the first time: a deque takes ~0.7 KiB, and idle connections are many)
        self.emptied: deque[float] | None = None

    def _level(self, now: float) -> float:
        """Tokens at ``now``: what was left, refilled since, at most ``capacity``."""
        return min(self.capacity, self._tokens + (now - self._last) * self._rate)

    def available(self, now: float) -> int:
        """Whole tokens left at ``now`` (what a read may spend before its rest is looked at)."""
        return int(self._level(now))

    def full(self, now: float) -> bool:
        return self._level(now) >= self.capacity

    def spend(self, now: float) -> bool:
        tokens = self._level(now)
        self._last = now
        if tokens < 1.0:
            self._tokens = tokens
            if self.emptied is None:
                self.emptied = deque(maxlen=STRIKES)
            self.emptied.append(now)
            return False
        self._tokens = tokens - 1.0
        return True

    def barred(self, now: float) -> bool:
        """Empty now, and emptied ``STRIKES`` times within the window: whoever spends it is back for
        more at once after each GOAWAY (a rapid-reset attacker that dials again)."""
        emptied = self.emptied
        return (
            emptied is not None and len(emptied) == STRIKES and now - emptied[0] <= self.window and self.available(now) < 1
        )


class ResetBuckets:
    """One ``ResetBucket`` per source address, shared by its connections: an attacker whose
    connection got GOAWAY for rapid reset and who dials again finds the bucket as it left it, so a
    new connection buys no new budget. At most ``max_sources`` are remembered; to make room, a
    bucket that has refilled (a source that did nothing wrong lately) is forgotten first, else the
    oldest."""

    def __init__(self, limit: ResetLimit, *, max_sources: int = 4096) -> None:
        self.limit = limit
        self.max_sources = max_sources
        self._buckets: dict[str, ResetBucket] = {}

    def __len__(self) -> int:
        return len(self._buckets)

    def barred(self, source: str, now: float) -> bool:
        """``source``'s bucket is ``ResetBucket.barred``: turn its next connection away at accept
        (it would cost a TLS handshake, then end at its first reset) until a token has come back."""
        bucket = self._buckets.get(source)
        return bucket is not None and bucket.barred(now)

    def bucket(self, source: str, now: float) -> ResetBucket:
        bucket = self._buckets.get(source)
        if bucket is None:
            if len(self._buckets) >= self.max_sources:
                self._make_room(now)
            bucket = self._buckets[source] = ResetBucket(self.limit, now)
        return bucket

    def _make_room(self, now: float) -> None:
        refilled = [source for source, bucket in self._buckets.items() if bucket.full(now)]
        for source in refilled or [next(iter(self._buckets))]:
            del self._buckets[source]


class FrameScanner:
    """Frame headers of the bytes a peer sends, checked as they arrive (see the module docstring).

    ``feed(data)`` for every read, in order, before h2 gets ``data``; ``settings_sent(max_frame_size)``
    for every SETTINGS frame this side sends (the value it leaves in force once acknowledged).
    """

    __slots__ = (
        "_block",
        "_partial",
        "_pending",
        "_preface",
        "_skip",
        "header_block_limit",
        "max_frame_size",
        "reset_cut",
    )

    def __init__(self, *, server: bool, header_block_limit: int) -> None:
        #: the frame size limit the peer has acknowledged (frames up to it are allowed)
        self.max_frame_size = DEFAULT_MAX_FRAME
        #: largest header block (HEADERS/PUSH_PROMISE + CONTINUATION payloads) accepted
        self.header_block_limit = header_block_limit
        #: MAX_FRAME_SIZE in force once each SETTINGS frame sent is acknowledged, oldest first
        # a list, not a deque: SETTINGS this side sent are few, and an idle connection small
        self._pending: list[int] = []
        #: bytes of the client preface still to come (a server's side only)
        self._preface = len(PREFACE) if server else 0
        #: bytes of the current frame's body still to come
        self._skip = 0
        #: the start of a frame header a read cut in two
        self._partial = b""
        #: bytes of the header block under way, None between blocks
        self._block: int | None = None
        #: after ``feed(data, resets_allowed=n)``: the offset just past the (n+1)-th RST_STREAM frame in
        #: ``data`` (feed h2 up to it, and look at the reset budget, before the rest), or None
        self.reset_cut: int | None = None

    @property
    def settings_unacknowledged(self) -> int:
        return len(self._pending)

    def settings_sent(self, max_frame_size: int | None = None) -> None:
        """This side sent a SETTINGS frame (changing MAX_FRAME_SIZE to ``max_frame_size``, if given)."""
        if max_frame_size is None:
            max_frame_size = self._pending[-1] if self._pending else self.max_frame_size
        self._pending.append(max_frame_size)

    def feed(self, data: bytes | bytearray | memoryview, *, resets_allowed: int | None = None) -> tuple[int, ...]:
        """Check the frame headers completed by ``data``. Returns the offsets in ``data`` just past
        each SETTINGS ACK that changed the frame size limit (usually none); raises
        ``BudgetExceededError`` (or h2's ``ProtocolError`` for a wrong preface) at the first bad one.

        With ``resets_allowed``, ``reset_cut`` is set to just past the RST_STREAM frame beyond that
        many, when more follows it in ``data`` (the offset is among those returned): h2 decodes every frame of what it is fed before
        anyone can count its resets, so a read packed with HEADERS + RST_STREAM pairs (64 KiB hold
        some 2,000) would cost that much work before the budget could end it."""
        size = len(data)
        self.reset_cut = None
        pos = self._skip
        if pos >= size:  # the common case on a bulk stream: all of it inside one frame's body
            self._skip = pos - size
            return _NO_SPLITS
        self._skip = 0
        splits: tuple[int, ...] = _NO_SPLITS
        if self._preface:
            pos = self._check_preface(data)
            if self._preface:
                return _NO_SPLITS
        if self._partial:
            need = 9 - len(self._partial)
            if size - pos < need:
                self._partial += bytes(data[pos:])
                return _NO_SPLITS
            header = self._partial + bytes(data[pos : pos + need])
            self._partial = b""
            hi, lo, kind, flags, _ = _HEADER.unpack(header)
            length = (hi << 8) | lo
            pos += need + length
            if self._check(length, kind, flags):
                splits = (min(pos, size),)
        unpack = _HEADER.unpack_from
        limit = self.max_frame_size
        resets = -1 if resets_allowed is None else resets_allowed
        while pos + 9 <= size:
            hi, lo, kind, flags, _ = unpack(data, pos)
            length = (hi << 8) | lo
            pos += 9 + length
            if kind == _RST_STREAM and resets >= 0:
                if not resets and pos < size:
                    self.reset_cut = pos
                    splits = (*splits, pos)
                resets -= 1
            if (length > limit or kind in _WATCHED or self._block is not None) and self._check(length, kind, flags):
                splits = (*splits, min(pos, size))
                limit = self.max_frame_size
        if pos > size:
            self._skip = pos - size
        elif pos < size:
            self._partial = bytes(data[pos:])
        return splits

    def _check_preface(self, data: bytes | bytearray | memoryview) -> int:
        done = len(PREFACE) - self._preface
        take = min(self._preface, len(data))
        if bytes(data[:take]) != PREFACE[done : done + take]:
            raise h2.exceptions.ProtocolError("Invalid HTTP/2 preamble.")
        self._preface -= take
        return take

    def _check(self, length: int, kind: int, flags: int) -> bool:
        """One frame header; True if it is a SETTINGS ACK that changed the frame size limit."""
        if length > self.max_frame_size:
            raise BudgetExceededError(
                f"frame of {length} bytes announced, larger than SETTINGS_MAX_FRAME_SIZE {self.max_frame_size}",
                h2.errors.ErrorCodes.FRAME_SIZE_ERROR,
            )
        if self._block is not None:
            if kind != _CONTINUATION:
                self._block = None  # h2 rejects the frame: a header block must end first
                return False
            self._block += length
            self._check_block()
            if flags & _END_HEADERS:
                self._block = None
            return False
        if kind in (_HEADERS, _PUSH_PROMISE):
            if not flags & _END_HEADERS:
                self._block = length
                self._check_block()
            return False
        if kind == _SETTINGS and flags & _ACK and self._pending:
            before = self.max_frame_size
            self.max_frame_size = self._pending.pop(0)
            return self.max_frame_size != before
        return False

    def _check_block(self) -> None:
        assert self._block is not None
        if self._block > self.header_block_limit:
            raise BudgetExceededError(
                f"header block over {self.header_block_limit} bytes (HEADERS + CONTINUATION)",
                h2.errors.ErrorCodes.ENHANCE_YOUR_CALM,
            )


#: frame types whose header the scanner must look at whatever their length
_WATCHED = frozenset({_HEADERS, _SETTINGS, _PUSH_PROMISE, _CONTINUATION})
