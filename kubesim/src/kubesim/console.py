"""A running container's console: the log the kubelet keeps of it, and its main process's stdin.

`ContainerConsole` holds a bounded history of timestamped lines, serves it as `kubectl logs`
would (tail, timestamps, since, limit, follow), and wakes followers with a `trio.Event`. The main
process behaves like `cat`: what attach writes to its stdin comes back as output lines, so it shows
in the log and to every attached client — unless a command runs as the main process
(`processes`), which then gets that stdin instead (`pipe_stdin`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Protocol

import attrs
import trio

DEFAULT_MAX_LINES = 10_000


class StdinSink(Protocol):
    """Where attach input goes when a command is the container's main process."""

    def write(self, data: bytes) -> None: ...

    def end(self) -> None: ...


@attrs.frozen(kw_only=True)
class LogLine:
    seq: int
    time_ns: int  # Unix time in nanoseconds
    text: str


def format_timestamp(time_ns: int) -> str:
    """RFC 3339 with a fixed nine-digit fraction, as the kubelet prefixes `--timestamps` lines."""
    seconds, nanos = divmod(time_ns, 1_000_000_000)
    moment = datetime.fromtimestamp(seconds, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + f".{nanos:09d}Z"


@attrs.frozen(kw_only=True)
class ConsoleStatistics:
    lines_held: int
    lines_logged: int
    followers: int
    closed: bool


class ContainerConsole:
    """One per running container. Not thread-safe: use it from the Trio run that serves it."""

    def __init__(
        self, *, max_lines: int = DEFAULT_MAX_LINES, clock: Callable[[], int] = time.time_ns
    ) -> None:
        if max_lines < 1:
            raise ValueError("max_lines must be positive")
        self._lines: deque[LogLine] = deque(maxlen=max_lines)
        self._next_seq = 0
        self._clock = clock
        self._changed = trio.Event()
        self._closed = False
        self._followers = 0
        self._stdin_partial = b""
        self._stdin_sink: StdinSink | None = None

    # -- writing --------------------------------------------------------------------------------

    def log(self, line: str) -> None:
        """Append a line (text with newlines is several lines) and wake followers."""
        if self._closed:
            raise trio.ClosedResourceError("the container has stopped")
        if line.endswith("\n"):
            line = line[:-1]
        now = self._clock()
        for text in line.split("\n"):
            self._lines.append(LogLine(seq=self._next_seq, time_ns=now, text=text))
            self._next_seq += 1
        self._wake()

    def close(self) -> None:
        """The container stopped: followers finish once they have what was logged."""
        if self._closed:
            return
        if self._stdin_partial:
            self.flush_stdin()
        self._closed = True
        self._wake()

    @property
    def closed(self) -> bool:
        return self._closed

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # -- the main process ----------------------------------------------------------------------

    def pipe_stdin(self, sink: StdinSink) -> None:
        """A command is the main process: attach input goes to `sink` instead of being echoed."""
        self._stdin_sink = sink

    @property
    def runs_command(self) -> bool:
        """Whether a command is the main process (attach then ends when it exits)."""
        return self._stdin_sink is not None

    def write_stdin(self, data: bytes) -> None:
        """Input for the main process, which echoes each complete line as output (like `cat`)."""
        if self._closed:
            return
        if self._stdin_sink is not None:
            self._stdin_sink.write(data)
            return
        lines = (self._stdin_partial + data).split(b"\n")
        self._stdin_partial = lines.pop()
        for line in lines:
            self.log(line.decode("utf-8", "replace"))

    def flush_stdin(self) -> None:
        """An attached stdin ended: the main process outputs the unterminated rest, if any."""
        if self._stdin_sink is not None:
            if not self._closed:
                self._stdin_sink.end()
            return
        partial, self._stdin_partial = self._stdin_partial, b""
        if partial and not self._closed:
            self.log(partial.decode("utf-8", "replace"))

    # -- reading ---------------------------------------------------------------------------------

    @property
    def next_seq(self) -> int:
        """The sequence number the next logged line will get."""
        return self._next_seq

    def lines_since(self, seq: int) -> list[LogLine]:
        """Held lines numbered `seq` or later (older ones may have been dropped)."""
        wanted = min(self._next_seq - max(seq, 0), len(self._lines))
        # Index from the right: a follower usually wants only the newest few lines.
        return [self._lines[-i] for i in range(wanted, 0, -1)]

    async def wait_for_line(self, seq: int) -> bool:
        """Wait until line `seq` exists (True) or the console closed without it (False)."""
        while self._next_seq <= seq:
            if self._closed:
                await trio.lowlevel.checkpoint()
                return False
            await self._changed.wait()
        await trio.lowlevel.checkpoint()
        return True

    async def follow(self, seq: int) -> AsyncIterator[LogLine]:
        """Every line from `seq` on, as it is logged, until the console closes."""
        self._followers += 1
        try:
            while await self.wait_for_line(seq):
                for line in self.lines_since(seq):
                    yield line
                    seq = line.seq + 1
        finally:
            self._followers -= 1

    async def stream_logs(
        self,
        *,
        follow: bool,
        tail_lines: int | None,
        timestamps: bool,
        since_time_ns: int | None = None,
        limit_bytes: int | None = None,
    ) -> AsyncIterator[bytes]:
        """The body of `GET .../log`: one chunk per line, newline-terminated.

        `tail_lines` keeps only the last N held lines (then follows, when asked); `since_time_ns`
        drops older lines; `limit_bytes` cuts the output after that many bytes and ends it.
        """
        if tail_lines is not None and tail_lines < 0:
            tail_lines = None
        held = self.lines_since(0)
        start = held[0].seq if held else self._next_seq
        if tail_lines is not None:
            start = self._next_seq - min(tail_lines, len(held))
        end = None if follow else self._next_seq
        remaining = limit_bytes
        if remaining is not None and remaining <= 0:
            await trio.lowlevel.checkpoint()
            return
        async for line in self._lines_from(start, end):
            if since_time_ns is not None and line.time_ns < since_time_ns:
                continue
            text = line.text + "\n"
            if timestamps:
                text = f"{format_timestamp(line.time_ns)} {text}"
            chunk = text.encode("utf-8")
            if remaining is not None:
                chunk = chunk[:remaining]
                remaining -= len(chunk)
            yield chunk
            if remaining is not None and remaining <= 0:
                return

    async def _lines_from(self, start: int, end: int | None) -> AsyncIterator[LogLine]:
        if end is not None:
            await trio.lowlevel.checkpoint()
            for line in self.lines_since(start):
                if line.seq >= end:
                    return
                yield line
            return
        async for line in self.follow(start):
            yield line

    def statistics(self) -> ConsoleStatistics:
        return ConsoleStatistics(
            lines_held=len(self._lines),
            lines_logged=self._next_seq,
            followers=self._followers,
            closed=self._closed,
        )
