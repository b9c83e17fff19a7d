"""What a running command sees of its standard streams, and the plumbing between them:
`CommandIO` (what the caller offers), `Streams` (what a command gets: stdin with give-back,
stdout, stderr, its filesystem and working directory, where ^C goes), writers to files and the
errors that stop a command (a broken pipe, a full filesystem), and the bounds on what a command
holds (`MAX_INPUT`, `PIPE_BUFFER`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any, Protocol

import attrs
import trio

from kubesim.fs import FileSystem, FileWriter


class CommandIO(Protocol):
    """What a running command sees of its standard streams."""

    @property
    def tty(self) -> bool:
        """Whether the streams are a terminal (prompts, echo, stderr merged into stdout)."""
        ...

    async def read_stdin(self) -> bytes:
        """The next chunk of stdin, b"" at EOF."""
        ...

    async def write_stdout(self, data: bytes) -> None: ...

    async def write_stderr(self, data: bytes) -> None: ...


@attrs.define
class CapturedIO:
    """A CommandIO over fixed stdin that records what the command writes (tests, exec probes)."""

    stdin: bytes = b""
    tty: bool = False
    stdout: bytearray = attrs.Factory(bytearray)
    stderr: bytearray = attrs.Factory(bytearray)

    async def read_stdin(self) -> bytes:
        await trio.lowlevel.checkpoint()
        data, self.stdin = self.stdin, b""
        return data

    async def write_stdout(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint()
        self.stdout += data

    async def write_stderr(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint()
        self.stderr += data


Reader = Callable[[], Coroutine[Any, Any, bytes]]
Writer = Callable[[bytes], Coroutine[Any, Any, None]]


class Stdin:
    """A stdin that can give back what a reader took too much of (`read`, the interactive shell)."""

    def __init__(self, read: Reader) -> None:
        self._read = read
        self._pending = b""

    async def read(self) -> bytes:
        if self._pending:
            data, self._pending = self._pending, b""
            await trio.lowlevel.checkpoint()
            return data
        # Not sticky: after a terminal's ^D, the next read waits for more typing.
        return await self._read()

    def unread(self, data: bytes) -> None:
        self._pending = data + self._pending

    async def read_line(self) -> tuple[bytes, bool]:
        """One line without its newline, and whether a newline ended it (False: EOF).

        Bounded: a line longer than `MAX_INPUT` ends there (the rest is the next line), so an
        endless stream without a newline cannot grow kubesim's memory; each chunk is searched
        once (no quadratic rescans)."""
        buffer = bytearray()
        while True:
            chunk = await self.read()
            if not chunk:
                return bytes(buffer), False
            newline = chunk.find(b"\n")
            if newline >= 0:
                buffer += chunk[:newline]
                self.unread(chunk[newline + 1 :])
            else:
                buffer += chunk
            if len(buffer) > MAX_INPUT:
                self.unread(bytes(buffer[MAX_INPUT:]) + (b"\n" if newline >= 0 else b""))
                return bytes(buffer[:MAX_INPUT]), True
            if newline >= 0:
                return bytes(buffer), True


@attrs.frozen(kw_only=True)
class Streams:
    stdin: Stdin
    write_stdout: Writer
    write_stderr: Writer
    tty: bool
    #: The container's filesystem and the command's working directory.
    fs: FileSystem
    cwd: str = "/"
    #: Where ^C on the terminal goes (None: not on a terminal, or nothing listens).
    interrupts: Interrupts | None = None

    async def read_stdin(self) -> bytes:
        return await self.stdin.read()

    def replace(self, **changes: object) -> Streams:
        return attrs.evolve(self, **changes)  # type: ignore[arg-type]


async def discard(data: bytes) -> None:
    await trio.lowlevel.checkpoint()


async def read_nothing() -> bytes:
    await trio.lowlevel.checkpoint()
    return b""


class WriteError(Exception):
    """Writing to a redirected file failed (a full filesystem): the command stops, as on EPIPE."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error)
        self.error = error


def file_writer(writer: FileWriter) -> Writer:
    async def write(data: bytes) -> None:
        await trio.lowlevel.checkpoint()
        try:
            writer.write(data)
        except OSError as exc:
            raise WriteError(exc) from None

    return write


def file_reader(chunks: Iterator[bytes]) -> Reader:
    async def read() -> bytes:
        await trio.lowlevel.checkpoint()
        return next(chunks, b"")

    return read


class BrokenPipe(Exception):
    """The reading end of a pipeline went away (SIGPIPE in a real shell)."""


def command_name(argv: Sequence[str]) -> str:
    return argv[0].rpartition("/")[2]


#: What a whole-input command (sort, tail, grep of files) holds at most.
MAX_INPUT = 64 * 1024 * 1024

#: Chunks a pipe (or a terminal's typed-ahead input) holds before its writer waits.
PIPE_BUFFER = 16


class Interrupts:
    """Where a terminal's ^C goes: to the innermost foreground job, like SIGINT to the terminal's
    foreground process group. An interactive shell makes each command it runs (and its own line
    reading) the foreground while it lasts; what is below (the exec'd command itself) gets ^C only
    when nothing above listens.
    """

    def __init__(self, base: Callable[[], None] | None = None) -> None:
        self._handlers: list[Callable[[], None]] = [] if base is None else [base]

    @contextlib.contextmanager
    def foreground(self, handler: Callable[[], None]) -> Iterator[None]:
        self._handlers.append(handler)
        try:
            yield
        finally:
            self._handlers.remove(handler)

    def interrupt(self) -> bool:
        """Deliver one ^C; False if nobody listens (then it is lost, as a SIGINT ignored)."""
        if not self._handlers:
            return False
        self._handlers[-1]()
        return True
