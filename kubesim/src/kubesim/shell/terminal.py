"""A pty stand-in for exec and attach with a TTY: `LineDiscipline` (canonical mode, sans-I/O)
and `Terminal`, which puts it in front of a command's streams.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import trio

from kubesim.shell.stdio import PIPE_BUFFER, CommandIO, Interrupts


@attrs.frozen(kw_only=True)
class TerminalInput:
    """What a chunk of keyboard input did: the echo to show, what a reader gets, signals.

    `reads` are in order what successive reads of the terminal return: completed lines, and b""
    for each ^D on an empty line (an end of file for that one read, as on a real tty).
    """

    echo: bytes = b""
    reads: tuple[bytes, ...] = ()
    interrupt: bool = False

    @property
    def eof(self) -> bool:
        return b"" in self.reads


#: the longest line a pty's canonical mode holds (Linux n_tty: N_TTY_BUF_SIZE - 1)
MAX_CANON = 4095


class LineDiscipline:
    """A pty's canonical mode, sans-I/O: echo, erase, ^U, ^C, ^\\, ^D, CR to NL; output NL to
    CRNL. Bounded as Linux's n_tty: a line holds at most `MAX_CANON` bytes, more rings the bell."""

    def __init__(self) -> None:
        self._line = bytearray()

    def feed(self, data: bytes) -> TerminalInput:
        echo = bytearray()
        lines: list[bytes] = []
        interrupt = False
        for byte in data:
            if byte in (0x0D, 0x0A):
                self._line.append(0x0A)
                echo += b"\r\n"
                lines.append(bytes(self._line))
                self._line.clear()
            elif byte in (0x7F, 0x08):
                if self._line:
                    # Erase a whole UTF-8 character, not one of its bytes.
                    while self._line and (self._line.pop() & 0xC0) == 0x80:
                        pass
                    echo += b"\b \b"
            elif byte == 0x15:  # ^U: kill the line
                echo += b"\b \b" * len(self._line.decode("utf-8", "replace"))
                self._line.clear()
            elif byte == 0x04:  # ^D: push the line, or EOF on an empty one
                lines.append(bytes(self._line))
                self._line.clear()
            elif byte == 0x03:  # ^C: the line is dropped, the foreground command interrupted
                echo += b"^C\r\n"
                self._line.clear()
                interrupt = True
            elif byte == 0x1C:  # ^\\ (VQUIT): a signal, not input; ISIG flushes the line
                echo += b"^\\"
                self._line.clear()
            elif len(self._line) >= MAX_CANON:
                echo += b"\a"  # n_tty: a full line takes nothing but its end (IMAXBEL's bell)
            elif byte < 0x20 and byte not in (0x09,):
                echo += b"^" + bytes((byte + 0x40,))
                self._line.append(byte)
            else:
                echo.append(byte)
                self._line.append(byte)
        return TerminalInput(echo=bytes(echo), reads=tuple(lines), interrupt=interrupt)

    @staticmethod
    def output(data: bytes) -> bytes:
        return data.replace(b"\n", b"\r\n")


class Terminal:
    """A pty in front of a command: cooked input with echo, and stderr merged into stdout.

    `raw` is the connection's side (bytes as typed, output to the client). Run `pump_input` in a
    task: it reads keyboard input even while the command is not reading, as a terminal does, so
    that echo and ^C work at any time. `on_interrupt` is called for ^C.
    """

    tty = True

    def __init__(self, raw: CommandIO, *, on_interrupt: Callable[[], None] | None = None) -> None:
        self._raw = raw
        self._discipline = LineDiscipline()
        self.interrupts = Interrupts(on_interrupt)
        self._send, self._receive = trio.open_memory_channel[bytes](PIPE_BUFFER)

    async def pump_input(self) -> None:
        async with self._send:
            while data := await self._raw.read_stdin():
                result = self._discipline.feed(data)
                if result.echo:
                    await self._raw.write_stdout(result.echo)
                if result.interrupt:
                    # ^C flushes what was typed ahead but not yet read, as a tty's ISIG does.
                    while True:
                        try:
                            self._receive.receive_nowait()
                        except trio.WouldBlock:
                            break
                    self.interrupts.interrupt()
                for read in result.reads:
                    await self._send.send(read)

    async def read_stdin(self) -> bytes:
        try:
            return await self._receive.receive()
        except trio.EndOfChannel:
            return b""

    async def write_stdout(self, data: bytes) -> None:
        await self._raw.write_stdout(LineDiscipline.output(data))

    async def write_stderr(self, data: bytes) -> None:
        await self._raw.write_stdout(LineDiscipline.output(data))
