"""tar archives as streams, sans-I/O: headers to write, and a reader fed bytes in any chunking.

The `tar` command (`shell`) drives these over a container's filesystem (`fs`), so neither side ever
holds more than a header block and the chunk at hand. Header blocks are made and parsed by the
standard library's `tarfile.TarInfo` (`tobuf`, `frombuf`: public API); the stream around them —
512-byte blocks, padding, the end-of-archive zero blocks, GNU long names (`L`/`K`) and pax
extended headers (`x`, what Go's archive/tar writes for names USTAR cannot hold, as `kubectl cp`
sends) — is here. Written archives are what busybox tar writes: GNU-format headers, names of
directories ending in "/", two zero blocks at the end (no padding to a record).

Bounded: a long name or pax header may hold at most `MAX_EXTENDED` bytes; anything else is data
that passes through.
"""

from __future__ import annotations

import math
import tarfile

import attrs

BLOCK = 512
END_OF_ARCHIVE = b"\0" * (2 * BLOCK)
MAX_EXTENDED = 64 * 1024
#: member mtimes are kept within years 1 to 9999 (what `ls -l` can show)
MIN_MTIME, MAX_MTIME = -62_135_596_800, 253_402_300_799


class TarError(Exception):
    """The archive is not a tar stream this reader understands (busybox: `invalid tar magic`)."""


def member_header(name: str, *, is_dir: bool, size: int = 0, mode: int = 0o644,
                  mtime: float = 0.0) -> bytes:
    """The header block(s) of one member, as busybox `tar c` writes them."""
    info = tarfile.TarInfo(name + "/" if is_dir and not name.endswith("/") else name)
    info.type = tarfile.DIRTYPE if is_dir else tarfile.REGTYPE
    info.size = 0 if is_dir else size
    info.mode = mode & 0o7777
    info.mtime = int(mtime)
    info.uname = info.gname = "root"
    return info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")


def padding(size: int) -> bytes:
    """The zeros after `size` bytes of member data, up to the block boundary."""
    return b"\0" * (-size % BLOCK)


@attrs.frozen(kw_only=True)
class Member:
    """A member starts: its data (`size` bytes) follows as `Data` events, then `MemberEnd`."""

    name: str
    kind: str  # "file", "dir", "symlink", "link", "other"
    mode: int
    size: int
    mtime: float
    linkname: str = ""


@attrs.frozen
class Data:
    data: bytes


@attrs.frozen
class MemberEnd:
    pass


@attrs.frozen
class End:
    """The end-of-archive marker (what follows it is ignored, as tar does)."""


Event = Member | Data | MemberEnd | End

_KINDS = {tarfile.REGTYPE: "file", tarfile.AREGTYPE: "file", tarfile.CONTTYPE: "file",
          tarfile.DIRTYPE: "dir", tarfile.SYMTYPE: "symlink", tarfile.LNKTYPE: "link"}


class TarReader:
    """Turns tar bytes, fed in any chunking, into events."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._remaining = 0  # member data still to pass on
        self._pad = 0  # padding still to skip
        self._extended: tuple[bytes, int] | None = None  # (type, size) being collected
        self._long_name: str | None = None
        self._long_link: str | None = None
        self._pax: dict[str, str] = {}
        self._ended = False

    @property
    def ended(self) -> bool:
        return self._ended

    @property
    def in_member(self) -> bool:
        """Whether the stream stopped inside a member or header (a truncated archive)."""
        return bool(self._remaining or self._pad or self._buffer or self._extended)

    def feed(self, data: bytes) -> list[Event]:
        events: list[Event] = []
        view = memoryview(data)
        while view and not self._ended:
            if self._remaining:
                take = view[: self._remaining]
                view = view[len(take):]
                self._remaining -= len(take)
                events.append(Data(bytes(take)))
                if not self._remaining:
                    events.append(MemberEnd())
                continue
            if self._pad:
                skip = min(self._pad, len(view))
                view = view[skip:]
                self._pad -= skip
                continue
            if self._extended is not None:
                kind, size = self._extended
                take = view[: size - len(self._buffer)]
                self._buffer += take
                view = view[len(take):]
                if len(self._buffer) == size:
                    self._finish_extended(kind, bytes(self._buffer))
                    self._buffer.clear()
                    self._extended = None
                    self._pad = -size % BLOCK
                continue
            take = view[: BLOCK - len(self._buffer)]
            self._buffer += take
            view = view[len(take):]
            if len(self._buffer) == BLOCK:
                block = bytes(self._buffer)
                self._buffer.clear()
                event = self._header(block)
                if event is not None:
                    events.append(event)
                    if isinstance(event, Member) and not self._remaining:
                        events.append(MemberEnd())  # no data follows
        return events

    def _header(self, block: bytes) -> Event | None:
        if block == b"\0" * BLOCK:
            self._ended = True
            return End()
        try:
            info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        except tarfile.HeaderError as exc:
            raise TarError("invalid tar magic") from exc
        if info.type in (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE,
                         tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE):
            if info.size > MAX_EXTENDED:
                raise TarError(f"extended header of {info.size} bytes is too long")
            if info.size == 0:
                return None
            self._extended = (info.type, info.size)
            return None
        name = self._long_name if self._long_name is not None else self._pax.get("path", info.name)
        linkname = self._long_link if self._long_link is not None else self._pax.get("linkpath", info.linkname)
        size = _pax_size(self._pax["size"]) if "size" in self._pax else info.size
        mtime = _pax_mtime(self._pax.get("mtime"), info.mtime)
        if size < 0:  # GNU base-256 has a sign bit: a negative size must not run the reader backwards
            raise TarError("corrupted octal value in tar header")
        self._long_name = self._long_link = None
        self._pax = {}
        kind = _KINDS.get(info.type, "other")
        if kind == "file" and name.endswith("/"):
            kind = "dir"  # old-style directories
        if kind in ("file", "other") or info.type == tarfile.CONTTYPE:
            self._remaining = size
            self._pad = -size % BLOCK
        else:
            size = 0
        if kind == "dir" and not name.endswith("/"):
            name += "/"  # as written (tarfile's parser drops it; `tar t` shows it)
        return Member(name=name, kind=kind, mode=info.mode, size=size, mtime=mtime, linkname=linkname)

    def _finish_extended(self, kind: bytes, data: bytes) -> None:
        if kind == tarfile.GNUTYPE_LONGNAME:
            self._long_name = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        elif kind == tarfile.GNUTYPE_LONGLINK:
            self._long_link = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        elif kind in (tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE):
            self._pax.update(_pax_records(data))
        # Global headers (XGLTYPE) carry nothing a member here needs.


def _pax_size(text: str) -> int:
    """A pax `size` record: decimal digits (anything else is a broken archive, not a crash)."""
    if not text.isascii() or not text.isdigit():
        raise TarError("invalid pax header")
    return int(text)


def _pax_mtime(text: str | None, fallback: float) -> float:
    """A pax `mtime` record (decimal seconds); an unreadable or absurd one leaves the header's."""
    def clamp(value: float) -> float:
        return float(min(max(value, MIN_MTIME), MAX_MTIME))

    try:
        value = float(text) if text is not None else clamp(fallback)
    except ValueError:
        return clamp(fallback)
    return clamp(value) if math.isfinite(value) else clamp(fallback)


def _pax_records(data: bytes) -> dict[str, str]:
    """`"%d %s=%s\\n"` records (POSIX.1-2001 pax), length-prefixed."""
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0 or not data[pos:space].isdigit():
            raise TarError("invalid pax header")
        length = int(data[pos:space])
        record = data[space + 1 : pos + length]
        if length <= 0 or pos + length > len(data) or not record.endswith(b"\n") or b"=" not in record:
            raise TarError("invalid pax header")
        key, _, value = record[:-1].partition(b"=")
        records[key.decode("utf-8", "replace")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records
