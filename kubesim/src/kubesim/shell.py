"""The commands a simulated container can run: a few busybox-like built-ins and a small `sh`.

Each command is a Trio coroutine over a `CommandIO` (stdin/stdout/stderr as async byte calls),
returning its exit status. `sh -c` understands sequences (`;`, newline, `&&`, `||`, `&`),
pipelines, quoting, `$VAR`/`${VAR}`/`$?`/`$1`, `$(...)`, assignments, the redirects `>&2`, `2>&1`,
`>/dev/null`, and the built-ins `exit`, `export`, `unset`, `set -e`, `read`, `cd`, `wait`, `test`.
Messages follow busybox (`sh: foo: not found`, status 127), as in a busybox-based image.
`Terminal` stands in for a pty when exec or attach asks for a TTY.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import math
import posixpath
import re
import stat
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

import attrs
import trio

from kubesim import httpservers, netsim, tarstream
from kubesim.fs import FileSystem, FileWriter, Stat, container_tree


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


# -- plumbing ------------------------------------------------------------------------------------

Reader = Callable[[], Coroutine[Any, Any, bytes]]
Writer = Callable[[bytes], Coroutine[Any, Any, None]]


class _Stdin:
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

        Bounded: a line longer than `_MAX_INPUT` ends there (the rest is the next line), so an
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
            if len(buffer) > _MAX_INPUT:
                self.unread(bytes(buffer[_MAX_INPUT:]) + (b"\n" if newline >= 0 else b""))
                return bytes(buffer[:_MAX_INPUT]), True
            if newline >= 0:
                return bytes(buffer), True


@attrs.frozen(kw_only=True)
class _Streams:
    stdin: _Stdin
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

    def replace(self, **changes: object) -> _Streams:
        return attrs.evolve(self, **changes)  # type: ignore[arg-type]


async def _discard(data: bytes) -> None:
    await trio.lowlevel.checkpoint()


async def _empty() -> bytes:
    await trio.lowlevel.checkpoint()
    return b""


def _streams(io: CommandIO, fs: FileSystem | None = None, cwd: str = "/") -> _Streams:
    if isinstance(io, _Streams):
        return io
    return _Streams(
        stdin=_Stdin(io.read_stdin),
        write_stdout=io.write_stdout,
        write_stderr=io.write_stderr,
        tty=io.tty,
        fs=fs if fs is not None else container_tree(FileSystem(), commands=tuple(_COMMANDS)),
        cwd=cwd,
        # A Terminal offers its interrupts; other streams have none.
        interrupts=getattr(io, "interrupts", None),
    )


# -- the commands --------------------------------------------------------------------------------

Command = Callable[[Sequence[str], _Streams, Mapping[str, str]], Awaitable[int]]
_COMMANDS: dict[str, Command] = {}
_BIN_DIRS = ("/bin", "/usr/bin", "/sbin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin")


def _command(*names: str) -> Callable[[Command], Command]:
    def register(fn: Command) -> Command:
        for name in names:
            _COMMANDS[name] = fn
        return fn

    return register


def _lookup(name: str) -> Command | None:
    if "/" in name:
        directory, _, base = name.rpartition("/")
        if directory not in _BIN_DIRS:
            return None
        name = base
    return _COMMANDS.get(name)


def is_command(name: str) -> bool:
    """Whether `name` (bare or under a bin directory) is something this container can run."""
    return _lookup(name) is not None


def command_names() -> list[str]:
    return sorted(_COMMANDS)


async def run_command(argv: list[str], io: CommandIO, env: Mapping[str, str], *,
                      fs: FileSystem | None = None, cwd: str = "/") -> int:
    """Run `argv` to completion and return its exit status.

    `fs` is the container's filesystem (default: a fresh image tree of its own), `cwd` the
    working directory.
    """
    if not argv:
        return 0
    fn = _lookup(argv[0])
    if fn is None:
        await io.write_stderr(f"sh: {argv[0]}: not found\n".encode())
        return 127
    if fs is None and not isinstance(io, _Streams):
        fs = container_tree(FileSystem(), hostname=env.get("HOSTNAME", "localhost"),
                            commands=tuple(_COMMANDS))
    streams = _streams(io, fs, cwd)
    try:
        return await fn(argv, streams, env)
    except _BrokenPipe:
        return 128 + 13  # SIGPIPE
    except _WriteError as exc:
        await streams.write_stderr(f"{_name(argv)}: write error: {exc.error.strerror}\n".encode())
        return 1


class _WriteError(Exception):
    """Writing to a redirected file failed (a full filesystem): the command stops, as on EPIPE."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error)
        self.error = error


def _file_writer(writer: FileWriter) -> Writer:
    async def write(data: bytes) -> None:
        await trio.lowlevel.checkpoint()
        try:
            writer.write(data)
        except OSError as exc:
            raise _WriteError(exc) from None

    return write


def _file_reader(chunks: Iterator[bytes]) -> Reader:
    async def read() -> bytes:
        await trio.lowlevel.checkpoint()
        return next(chunks, b"")

    return read


class _BrokenPipe(Exception):
    """The reading end of a pipeline went away (SIGPIPE in a real shell)."""


def _name(argv: Sequence[str]) -> str:
    return argv[0].rpartition("/")[2]


_ECHO_ESCAPES = {
    "n": "\n", "t": "\t", "\\": "\\", "a": "\a", "b": "\b", "r": "\r", "v": "\v", "f": "\f",
    "e": "\x1b",
}


def _unescape(text: str) -> tuple[str, bool]:
    """Backslash escapes as echo -e and printf know them; True if `\\c` asked to stop."""
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char != "\\" or i + 1 == len(text):
            out.append(char)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "c":
            return "".join(out), True
        if nxt in _ECHO_ESCAPES:
            out.append(_ECHO_ESCAPES[nxt])
            i += 2
        elif nxt in "01234567":
            match = re.match(r"0?[0-7]{1,3}", text[i + 1 : i + 5])
            assert match is not None
            out.append(chr(int(match.group(0), 8) & 0xFF))
            i += 1 + len(match.group(0))
        else:
            out.append("\\" + nxt)
            i += 2
    return "".join(out), False


@_command("echo")
async def _echo(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    args = list(argv[1:])
    newline, escapes = True, False
    while args and re.fullmatch(r"-[neE]+", args[0]):
        for flag in args.pop(0)[1:]:
            if flag == "n":
                newline = False
            else:
                escapes = flag == "e"
    text = " ".join(args)
    if escapes:
        text, stop = _unescape(text)
        newline = newline and not stop
    await io.write_stdout((text + ("\n" if newline else "")).encode())
    return 0


@_command("cat")
async def _cat(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    files = [a for a in argv[1:] if a != "-u"] or ["-"]
    status = 0
    for path in files:
        if path == "-":
            while data := await io.read_stdin():
                await io.write_stdout(data)
            continue
        try:
            if io.fs.is_dir(path, io.cwd):
                await io.write_stderr(b"cat: read error: Is a directory\n")
                status = 1
                continue
            chunks = io.fs.read_chunks(path, io.cwd)
        except OSError as exc:
            await io.write_stderr(f"cat: can't open '{path}': {exc.strerror}\n".encode())
            status = 1
            continue
        for chunk in chunks:
            await io.write_stdout(chunk)
    return status


@_command("env", "printenv")
async def _env(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    if _name(argv) == "printenv":
        names = argv[1:]
        if not names:
            await io.write_stdout("".join(f"{k}={v}\n" for k, v in env.items()).encode())
            return 0
        found = [env[n] for n in names if n in env]
        await io.write_stdout("".join(f"{v}\n" for v in found).encode())
        return 0 if len(found) == len(names) else 1
    args = list(argv[1:])
    child = dict(env)
    if args and args[0] in ("-i", "-"):
        args.pop(0)
        child = {}
    while args and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", args[0]):
        key, _, value = args.pop(0).partition("=")
        child[key] = value
    if args:
        if not is_command(args[0]):
            await io.write_stderr(f"env: can't execute '{args[0]}': No such file or directory\n".encode())
            return 127
        return await run_command(args, io, child)
    await io.write_stdout("".join(f"{k}={v}\n" for k, v in child.items()).encode())
    return 0


@_command("date")
async def _date(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    now_ns = time.time_ns()
    moment = datetime.fromtimestamp(now_ns // 1_000_000_000, UTC)
    fmt = "%a %b %e %H:%M:%S %Z %Y"
    for arg in argv[1:]:
        if arg.startswith("+"):
            fmt = arg[1:]
        elif arg in ("-u", "--utc"):
            pass
        elif arg in ("-I", "--iso-8601"):
            fmt = "%Y-%m-%d"
        elif arg in ("-R", "--rfc-2822"):
            fmt = "%a, %d %b %Y %H:%M:%S +0000"
        else:
            await io.write_stderr(f"date: invalid date '{arg}'\n".encode())
            return 1
    fmt = fmt.replace("%N", f"{now_ns % 1_000_000_000:09d}")
    await io.write_stdout((moment.strftime(fmt) + "\n").encode())
    return 0


_SLEEP_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


@_command("sleep")
async def _sleep(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    if len(argv) < 2:
        await io.write_stderr(b"sleep: missing operand\n")
        return 1
    total = 0.0
    for arg in argv[1:]:
        if arg in ("inf", "infinity"):
            total = math.inf
            continue
        match = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)([smhd]?)", arg)
        if match is None:
            await io.write_stderr(f"sleep: invalid number '{arg}'\n".encode())
            return 1
        total += float(match.group(1)) * _SLEEP_UNITS[match.group(2)]
    await trio.sleep(total)
    return 0


@_command("true", ":")
async def _true(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    await trio.lowlevel.checkpoint()
    return 0


@_command("false")
async def _false(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    await trio.lowlevel.checkpoint()
    return 1


@_command("exit")
async def _exit(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    await trio.lowlevel.checkpoint()
    if len(argv) < 2:
        return 0
    try:
        return int(argv[1]) & 0xFF
    except ValueError:
        await io.write_stderr(f"sh: exit: Illegal number: {argv[1]}\n".encode())
        return 2


@_command("hostname")
async def _hostname(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    await io.write_stdout((env.get("HOSTNAME", "localhost") + "\n").encode())
    return 0


@_command("pwd")
async def _pwd(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    await io.write_stdout((io.cwd + "\n").encode())
    return 0


@_command("whoami")
async def _whoami(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    await io.write_stdout(b"root\n")
    return 0


@_command("id")
async def _id(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    await io.write_stdout(b"uid=0(root) gid=0(root) groups=0(root),10(wheel)\n")
    return 0


@_command("uname")
async def _uname(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    await io.write_stdout(b"Linux\n")
    return 0


_PRINTF_SPEC = re.compile(r"%([-+ 0#]*)(\d*)(?:\.(\d+))?([sdicxXoeEfgGb%])")


@_command("printf")
async def _printf(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    if len(argv) < 2:
        await io.write_stderr(b"printf: usage: printf FORMAT [ARGUMENT...]\n")
        return 1
    fmt, args = argv[1], list(argv[2:])
    status = 0
    out: list[str] = []
    errors: list[str] = []
    while True:
        consumed = False

        def convert(match: re.Match[str]) -> str:
            nonlocal consumed, status
            flags, width, precision, kind = match.groups()
            if kind == "%":
                return "%"
            consumed = True
            arg = args.pop(0) if args else ""
            spec = "%" + flags + width + (f".{precision}" if precision else "")
            if kind in "sb":
                return (spec + "s") % (_unescape(arg)[0] if kind == "b" else arg)
            if kind == "c":
                return arg[:1]
            text = arg.strip() or "0"
            try:
                number: float = float(text) if kind in "eEfgG" else _c_integer(text)
            except ValueError:
                errors.append(f"printf: invalid number '{arg}'")
                status = 1
                number = 0
            return (spec + kind.replace("i", "d")) % number

        text, stop = _unescape(_PRINTF_SPEC.sub(convert, fmt))
        out.append(text)
        if stop or not consumed or not args:
            break
    await io.write_stdout("".join(out).encode())
    for message in errors:
        await io.write_stderr(f"{message}\n".encode())
    return status


def _c_integer(text: str) -> int:
    """An integer as strtol(..., 0) reads it: 0x hex, leading-0 octal, else decimal."""
    if re.fullmatch(r"[+-]?0[xX][0-9a-fA-F]+", text):
        return int(text, 16)
    if re.fullmatch(r"[+-]?0[0-7]+", text):
        return int(text, 8)
    return int(text)


@_command("test", "[")
async def _test(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    await trio.lowlevel.checkpoint()
    args = list(argv[1:])
    if _name(argv) == "[":
        if not args or args[-1] != "]":
            await io.write_stderr(b"[: missing ]\n")
            return 2
        args.pop()
    try:
        return 0 if _evaluate_test(args, io) else 1
    except ValueError as exc:
        await io.write_stderr(f"sh: {exc}\n".encode())
        return 2


def _evaluate_test(args: list[str], io: _Streams) -> bool:
    if args and args[0] == "!":
        return not _evaluate_test(args[1:], io)
    if not args:
        return False
    if len(args) == 1:
        return args[0] != ""
    if len(args) == 2:
        op, value = args
        if op == "-n":
            return value != ""
        if op == "-z":
            return value == ""
        if op in _FILE_TESTS:
            try:
                info = io.fs.stat(value, io.cwd) if value else None
            except OSError:
                info = None
            return info is not None and _FILE_TESTS[op](info)
        raise ValueError(f"{op}: unary operator expected")
    if len(args) == 3:
        left, op, right = args
        if op in ("=", "=="):
            return left == right
        if op == "!=":
            return left != right
        numeric = {"-eq": "__eq__", "-ne": "__ne__", "-lt": "__lt__", "-le": "__le__",
                   "-gt": "__gt__", "-ge": "__ge__"}
        if op in numeric:
            try:
                a, b = int(left), int(right)
            except ValueError:
                raise ValueError(f"invalid number '{left if not left.lstrip('-').isdigit() else right}'") from None
            return bool(getattr(a, numeric[op])(b))
        raise ValueError(f"{op}: binary operator expected")
    raise ValueError("too many arguments")


_FILE_TESTS: dict[str, Callable[[Stat], bool]] = {
    "-e": lambda info: True, "-f": lambda info: info.is_file, "-d": lambda info: info.is_dir,
    "-s": lambda info: info.size > 0, "-r": lambda info: True, "-w": lambda info: True,
    "-x": lambda info: bool(info.mode & 0o111), "-c": lambda info: stat.S_ISCHR(info.mode),
    "-L": lambda info: False, "-h": lambda info: False, "-p": lambda info: False,
    "-b": lambda info: False, "-S": lambda info: False,
}


async def _inputs(
    name: str, paths: Sequence[str], io: _Streams, env: Mapping[str, str]
) -> tuple[bytes, int]:
    """All of the named files (or stdin) and an exit status; missing files are reported."""
    files = list(paths) or ["-"]
    data, status = bytearray(), 0
    for path in files:
        if path == "-":
            # Bounded as files are: `yes | sort` or an endless `exec -i` stream must not
            # grow kubesim's memory without end.
            while chunk := await io.read_stdin():
                if len(data) + len(chunk) > _MAX_INPUT:
                    await io.write_stderr(f"{name}: -: File too large\n".encode())
                    return bytes(data), 1
                data += chunk
            continue
        try:
            chunks = io.fs.read_chunks(path, io.cwd)
            for chunk in chunks:
                if len(data) + len(chunk) > _MAX_INPUT:
                    raise OSError(errno.EFBIG, "File too large", path)
                data += chunk
        except OSError as exc:
            await io.write_stderr(f"{name}: {path}: {exc.strerror}\n".encode())
            status = 1
    return bytes(data), status


#: What a whole-input command (sort, tail, grep of files) holds at most.
_MAX_INPUT = 64 * 1024 * 1024


def _split_lines(data: bytes) -> list[bytes]:
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


def _count_option(args: list[str], default: int) -> int:
    """`-n N`, `-nN` or `-N`, removed from `args`."""
    count = default
    for i, arg in enumerate(args):
        if arg == "-n" and i + 1 < len(args):
            count = int(args[i + 1].lstrip("+-"))
            del args[i : i + 2]
            break
        if re.fullmatch(r"-n?\d+", arg):
            count = int(arg.lstrip("-n"))
            del args[i]
            break
    return count


@_command("head")
async def _head(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    args = list(argv[1:])
    try:
        count = _count_option(args, 10)
    except ValueError:
        await io.write_stderr(b"head: invalid number\n")
        return 1
    if args and args != ["-"]:
        data, status = await _inputs("head", args, io, env)
        lines = data.split(b"\n")
        await io.write_stdout(b"\n".join(lines[:count]) + (b"\n" if len(lines) > count else b""))
        return status
    # Read only what is needed, so that the writer of a pipe sees it close (`yes | head`).
    buffer, newlines = bytearray(), 0
    while newlines < count and len(buffer) <= _MAX_INPUT and (chunk := await io.read_stdin()):
        buffer += chunk  # bounded: a stream without newlines stops at _MAX_INPUT
        newlines += chunk.count(b"\n")
    lines = bytes(buffer).split(b"\n")
    await io.write_stdout(b"\n".join(lines[:count]) + (b"\n" if len(lines) > count else b""))
    return 0


@_command("tail")
async def _tail(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    args = list(argv[1:])
    try:
        count = _count_option(args, 10)
    except ValueError:
        await io.write_stderr(b"tail: invalid number\n")
        return 1
    data, status = await _inputs("tail", args, io, env)
    lines = _split_lines(data)
    kept = lines[-count:] if count else []
    await io.write_stdout(b"".join(line + b"\n" for line in kept))
    return status


@_command("wc")
async def _wc(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    flags = "".join(a[1:] for a in argv[1:] if a.startswith("-") and a != "-") or "lwc"
    files = [a for a in argv[1:] if not a.startswith("-") or a == "-"]
    data, status = await _inputs("wc", files, io, env)
    counts = {"l": data.count(b"\n"), "w": len(data.split()), "c": len(data)}
    fields = [counts[f] for f in "lwc" if f in flags]
    text = f"{fields[0]}" if len(fields) == 1 else " ".join(f"{n:>7}" for n in fields)
    await io.write_stdout((text + "\n").encode())
    return status


@_command("sort")
async def _sort(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    flags = "".join(a[1:] for a in argv[1:] if a.startswith("-") and a != "-")
    files = [a for a in argv[1:] if not a.startswith("-") or a == "-"]
    data, status = await _inputs("sort", files, io, env)
    lines = _split_lines(data)
    if "n" in flags:
        def number(line: bytes) -> float:
            match = re.match(rb"\s*(-?\d+(?:\.\d+)?)", line)
            return float(match.group(1)) if match else 0.0

        lines.sort(key=number, reverse="r" in flags)
    else:
        lines.sort(reverse="r" in flags)
    if "u" in flags:
        lines = list(dict.fromkeys(lines))
    await io.write_stdout(b"".join(line + b"\n" for line in lines))
    return status


@_command("grep")
async def _grep(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    args = list(argv[1:])
    flags = ""
    while args and args[0].startswith("-") and len(args[0]) > 1:
        option = args.pop(0)
        if option == "--":
            break
        if option == "-e":
            break
        flags += option[1:]
    if not args:
        await io.write_stderr(b"Usage: grep [-vicqFE] PATTERN [FILE]...\n")
        return 2
    pattern, files = args[0], args[1:]
    text = re.escape(pattern) if "F" in flags else _posix_regex(pattern, extended="E" in flags)
    try:
        regex = re.compile(text.encode(), re.IGNORECASE if "i" in flags else 0)
    except re.error:
        await io.write_stderr(f"grep: bad regex '{pattern}'\n".encode())
        return 2
    data, status = await _inputs("grep", files, io, env)
    matched = [line for line in _split_lines(data) if bool(regex.search(line)) != ("v" in flags)]
    if "q" in flags:
        pass
    elif "c" in flags:
        await io.write_stdout(f"{len(matched)}\n".encode())
    else:
        await io.write_stdout(b"".join(line + b"\n" for line in matched))
    if status:
        return 2
    return 0 if matched else 1


def _posix_regex(pattern: str, *, extended: bool) -> str:
    if extended:
        return pattern
    # Basic regular expressions: \( \) \{ \} \| are the operators, bare ones are literal.
    out: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            out.append(nxt if nxt in "(){}|+?" else "\\" + nxt)
            i += 2
            continue
        out.append("\\" + char if char in "(){}|+?" else char)
        i += 1
    return "".join(out)


@_command("seq")
async def _seq(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    try:
        numbers = [int(a) for a in argv[1:]]
    except ValueError:
        await io.write_stderr(b"seq: invalid number\n")
        return 1
    if not 1 <= len(numbers) <= 3:
        await io.write_stderr(b"Usage: seq [FIRST [INC]] LAST\n")
        return 1
    first, step, last = (1, 1, numbers[0]) if len(numbers) == 1 else (
        (numbers[0], 1, numbers[1]) if len(numbers) == 2 else tuple(numbers)
    )
    if step == 0:
        return 1
    values = range(first, last + (1 if step > 0 else -1), step)
    for start in range(0, len(values), 1024):
        await io.write_stdout("".join(f"{n}\n" for n in values[start : start + 1024]).encode())
    return 0


@_command("httpd")
async def _httpd(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    """busybox httpd: serve the files under `-h HOME` on `-p [IP:]PORT` (default 80) in this pod.

    It listens through the pod's ports (`netsim.current_ports`) until it is stopped. kubesim has no
    daemons, so it runs in the foreground with or without `-f`. Files come from the container's
    filesystem (`io.fs`).
    """
    args, port, home = list(argv[1:]), 80, ""
    while args:
        arg = args.pop(0)
        if arg in ("-f", "-v", "-vv"):
            continue
        if arg in ("-p", "-h") and args:
            value = args.pop(0)
            if arg == "-h":
                home = value
                continue
            port_text = value.rpartition(":")[2]
            if not port_text.isdigit() or not 0 < int(port_text) < 65536:
                await io.write_stderr(f"httpd: bad port '{value}'\n".encode())  # xatou16's complaint
                return 1
            port = int(port_text)
            continue
        await io.write_stderr(b"Usage: httpd [-ifv[v]] [-c CONFFILE] [-p [IP:]PORT] [-u USER[:GRP]] "
                              b"[-r REALM] [-h HOME]\n")
        return 1
    files = io.fs
    home = posixpath.normpath(posixpath.join(io.cwd, home or "."))
    try:
        if not files.stat(home).is_dir:
            raise NotADirectoryError(20, "Not a directory")
    except OSError as exc:
        await io.write_stderr(f"httpd: can't change directory to '{home}': {exc.strerror}\n".encode())
        return 1
    ports = netsim.current_ports.get() or netsim.PodPorts()
    try:
        with ports.listen(port, functools.partial(httpservers.serve_httpd, files=files, home=home)):
            await trio.sleep_forever()
    except OSError as exc:
        await io.write_stderr(f"httpd: bind: {exc.strerror}\n".encode())
        return 1
    return 0  # not reached: httpd runs until it is stopped


@_command("yes")
async def _yes(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    line = ((" ".join(argv[1:]) or "y") + "\n").encode()
    block = line * max(1, 4096 // len(line))
    while True:
        await io.write_stdout(block)


@_command("sh", "ash", "bash")
async def _sh(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    args = list(argv[1:])
    options: list[str] = []
    while args and re.fullmatch(r"[-+][a-z]+", args[0]) and args[0] != "-c":
        options.append(args.pop(0))
    shell = _Shell(env=env, name=_name(argv))
    shell.cwd = io.cwd
    shell.vars["PWD"] = io.cwd
    for option in options:
        shell.set_option(option)
    if args and args[0] == "-c":
        if len(args) < 2:
            await io.write_stderr(b"sh: -c requires an argument\n")
            return 2
        script = args[1]
        if len(args) > 2:
            shell.name, shell.positional = args[2], args[3:]
        return await shell.run_source(script, io)
    if args:
        await io.write_stderr(f"sh: can't open '{args[0]}': No such file or directory\n".encode())
        return 127
    return await shell.interact(io)


# -- files: ls, mkdir, rm, touch, cp, mv, chmod, tar over the container's filesystem ---------------


def _options(argv: Sequence[str], allowed: str) -> tuple[set[str], list[str]] | str:
    """busybox getopt: flag clusters anywhere before `--`; an unknown flag is the error text."""
    flags: set[str] = set()
    operands: list[str] = []
    args = list(argv[1:])
    while args:
        arg = args.pop(0)
        if arg == "--":
            operands.extend(args)
            break
        if arg.startswith("-") and len(arg) > 1:
            for flag in arg[1:]:
                if flag not in allowed:
                    return f"{_name(argv)}: invalid option -- '{flag}'"
                flags.add(flag)
        else:
            operands.append(arg)
    return flags, operands


async def _usage_error(io: _Streams, message: str) -> int:
    await io.write_stderr(f"{message}\n".encode())
    return 1


def _ls_time(mtime_ns: int) -> str:
    moment = datetime.fromtimestamp(mtime_ns // 1_000_000_000, UTC)
    age = time.time() - mtime_ns / 1e9
    # Like busybox (and coreutils): the year instead of the time for files over six months old.
    if age > 365.25 * 86400 / 2 or age < -3600:
        return f"{moment:%b} {moment.day:2d}  {moment.year}"
    return f"{moment:%b} {moment.day:2d} {moment:%H:%M}"


def _ls_long(name: str, info: Stat) -> str:
    return (f"{stat.filemode(info.mode):<10} {info.nlink:>4} {'root':<8} {'root':<8} "
            f"{info.size:>9} {_ls_time(info.mtime_ns)} {name}")


def _ls_columns(names: list[str], width: int = 80) -> str:
    if not names:
        return ""
    column = max(len(n) for n in names) + 2
    columns = max(1, width // column)
    rows = -(-len(names) // columns)
    lines = []
    for row in range(rows):
        cells = names[row::rows]
        lines.append("".join(n.ljust(column) for n in cells[:-1]) + cells[-1])
    return "\n".join(lines) + "\n"


@_command("ls")
async def _ls(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    parsed = _options(argv, "laA1dFh")
    if isinstance(parsed, str):
        return await _usage_error(io, parsed)
    flags, operands = parsed
    status = 0
    files: list[tuple[str, Stat]] = []
    dirs: list[tuple[str, Stat]] = []
    for operand in operands or ["."]:
        try:
            info = io.fs.stat(operand, io.cwd)
        except OSError as exc:
            await io.write_stderr(f"ls: {operand}: {exc.strerror}\n".encode())
            status = 1
            continue
        (dirs if info.is_dir and "d" not in flags else files).append((operand, info))

    def mark(name: str, info: Stat) -> str:
        if "F" not in flags:
            return name
        return name + ("/" if info.is_dir else "*" if info.is_file and info.mode & 0o111 else "")

    async def show(entries: list[tuple[str, Stat]], *, total: bool) -> None:
        if "l" in flags:
            lines = [_ls_long(mark(n, i), i) for n, i in entries]
            if total:
                blocks = sum(-(-i.size // 4096) * 4 for _, i in entries if i.is_file)
                lines.insert(0, f"total {blocks}")
            text = "".join(line + "\n" for line in lines)
        elif io.tty and "1" not in flags:
            text = _ls_columns([mark(n, i) for n, i in entries])
        else:
            text = "".join(mark(n, i) + "\n" for n, i in entries)
        await io.write_stdout(text.encode())

    files.sort()
    if files:
        await show(files, total=False)
    dirs.sort()
    for index, (operand, _) in enumerate(dirs):
        names = io.fs.listdir(operand, io.cwd)
        if "a" not in flags and "A" not in flags:
            names = [n for n in names if not n.startswith(".")]
        base = io.fs.resolve(operand, io.cwd)
        entries = [(n, io.fs.stat(posixpath.join(base, n))) for n in names]
        if "a" in flags:
            parent = posixpath.dirname(base)
            entries = [(".", io.fs.stat(base)), ("..", io.fs.stat(parent)), *entries]
        if len(dirs) > 1 or files or status:
            header = f"{operand}:\n"
            await io.write_stdout(((("\n" if index or files else "") + header)).encode())
        await show(entries, total=True)
    return status


@_command("mkdir")
async def _mkdir(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    args = list(argv)
    mode = 0o755
    if "-m" in args[1:]:
        at = args.index("-m", 1)
        try:
            mode = int(args[at + 1], 8)
        except (IndexError, ValueError):
            return await _usage_error(io, f"mkdir: invalid mode '{args[at + 1] if at + 1 < len(args) else ''}'")
        del args[at : at + 2]
    parsed = _options(args, "pv")
    if isinstance(parsed, str):
        return await _usage_error(io, parsed)
    flags, operands = parsed
    if not operands:
        return await _usage_error(io, "mkdir: missing operand")
    status = 0
    for operand in operands:
        try:
            io.fs.mkdir(operand, io.cwd, mode=mode, parents="p" in flags)
        except OSError as exc:
            await io.write_stderr(f"mkdir: can't create directory '{operand}': {exc.strerror}\n".encode())
            status = 1
    await trio.lowlevel.checkpoint()
    return status


@_command("rmdir")
async def _rmdir(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    status = 0
    for operand in argv[1:]:
        try:
            if not io.fs.stat(operand, io.cwd).is_dir:
                raise OSError(errno.ENOTDIR, "Not a directory", operand)
            io.fs.remove(operand, io.cwd)
        except OSError as exc:
            await io.write_stderr(f"rmdir: '{operand}': {exc.strerror}\n".encode())
            status = 1
    await trio.lowlevel.checkpoint()
    return status


@_command("rm")
async def _rm(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    parsed = _options(argv, "rRfiv")
    if isinstance(parsed, str):
        return await _usage_error(io, parsed)
    flags, operands = parsed
    recursive = bool(flags & {"r", "R"})
    status = 0
    for operand in operands:
        try:
            if io.fs.stat(operand, io.cwd).is_dir and not recursive:
                await io.write_stderr(f"rm: '{operand}' is a directory\n".encode())
                status = 1
                continue
            io.fs.remove(operand, io.cwd, recursive=True)
        except OSError as exc:
            if "f" in flags and exc.errno == errno.ENOENT:
                continue
            await io.write_stderr(f"rm: can't remove '{operand}': {exc.strerror}\n".encode())
            status = 1
    await trio.lowlevel.checkpoint()
    return status


@_command("touch")
async def _touch(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    parsed = _options(argv, "cam")
    if isinstance(parsed, str):
        return await _usage_error(io, parsed)
    flags, operands = parsed
    status = 0
    for operand in operands:
        if "c" in flags and not io.fs.exists(operand, io.cwd):
            continue
        try:
            io.fs.touch(operand, io.cwd)
        except OSError as exc:
            await io.write_stderr(f"touch: {operand}: {exc.strerror}\n".encode())
            status = 1
    await trio.lowlevel.checkpoint()
    return status


@_command("chmod")
async def _chmod(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    if len(argv) < 3 or not re.fullmatch(r"[0-7]{1,4}", argv[1]):
        return await _usage_error(io, "chmod: only octal modes are supported by kubesim")
    status = 0
    for operand in argv[2:]:
        try:
            io.fs.chmod(operand, int(argv[1], 8), io.cwd)
        except OSError as exc:
            await io.write_stderr(f"chmod: {operand}: {exc.strerror}\n".encode())
            status = 1
    await trio.lowlevel.checkpoint()
    return status


def _copy_tree(fs: FileSystem, source: str, target: str) -> None:
    """Copy a file or (recursively) a directory; both absolute paths, `target` not existing."""
    pending = [(source, target)]  # a stack, not recursion: a tree may be deeper than the limit
    while pending:
        source, target = pending.pop()
        info = fs.stat(source)
        if info.is_dir:
            fs.mkdir(target, mode=info.mode)
            pending.extend((posixpath.join(source, name), posixpath.join(target, name))
                           for name in reversed(fs.listdir(source)))
            continue
        writer = fs.open_write(target, mode=info.mode)
        for chunk in fs.read_chunks(source):
            writer.write(chunk)


@_command("cp", "mv")
async def _cp(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    name = _name(argv)
    parsed = _options(argv, "rRafpv" if name == "cp" else "fiv")
    if isinstance(parsed, str):
        return await _usage_error(io, parsed)
    flags, operands = parsed
    if len(operands) < 2:
        return await _usage_error(io, f"{name}: missing destination file operand")
    *sources, dest = operands
    fs, cwd = io.fs, io.cwd
    dest_is_dir = fs.is_dir(dest, cwd)
    if len(sources) > 1 and not dest_is_dir:
        return await _usage_error(io, f"{name}: '{dest}' is not a directory")
    status = 0
    for source in sources:
        src = fs.resolve(source, cwd)
        dst = fs.resolve(posixpath.join(dest, posixpath.basename(src)) if dest_is_dir else dest, cwd)
        try:
            info = fs.stat(src)
            if name == "mv":
                fs.rename(src, dst)
                continue
            if info.is_dir and not flags & {"r", "R", "a"}:
                await io.write_stderr(f"cp: omitting directory '{source}'\n".encode())
                status = 1
                continue
            if (dst + "/").startswith(src + "/"):
                raise OSError(errno.EINVAL, "Invalid argument", dest)
            if fs.exists(dst) and not (info.is_dir and fs.is_dir(dst)):
                fs.remove(dst, recursive=True)
            if info.is_dir and fs.is_dir(dst):
                for child in fs.listdir(src):
                    _copy_tree(fs, posixpath.join(src, child), posixpath.join(dst, child))
            else:
                _copy_tree(fs, src, dst)
        except OSError as exc:
            verb = "can't stat" if exc.errno == errno.ENOENT and not fs.exists(src) else (
                "can't rename" if name == "mv" else "can't create")
            shown = source if verb == "can't stat" or name == "mv" else dst
            await io.write_stderr(f"{name}: {verb} '{shown}': {exc.strerror}\n".encode())
            status = 1
    await trio.lowlevel.checkpoint()
    return status


# -- tar -----------------------------------------------------------------------------------------


class _TarFailed(Exception):
    """busybox's bb_error_msg_and_die in tar: the message, then exit 1."""


def _strip_unsafe_prefix(name: str) -> str:
    """busybox's strip_unsafe_prefix: leading '/' and anything up to a '../' go."""
    rest = name
    while True:
        if rest.startswith("/"):
            rest = rest[1:]
        elif rest.startswith("../"):
            rest = rest[3:]
        elif (cut := rest.find("/../")) >= 0:
            rest = rest[cut + 4 :]
        else:
            return rest


class _Tar:
    """One run of busybox tar: `c`, `x` or `t`, over the container's filesystem."""

    def __init__(self, io: _Streams, *, base: str, verbose: bool, keep_mtime: bool, to_stdout: bool) -> None:
        self.io = io
        self.fs = io.fs
        self.base = base
        self.verbose = verbose
        self.keep_mtime = keep_mtime
        self.to_stdout = to_stdout
        self.warned = False
        self.failed = False

    async def warn_prefix(self, original: str, stripped: str) -> None:
        if stripped != original and not self.warned:
            self.warned = True
            removed = original[: len(original) - len(stripped)]
            await self.io.write_stderr(f"tar: removing leading '{removed}' from member names\n".encode())

    async def create(self, operands: list[str], out: Writer) -> None:
        if not operands:
            raise _TarFailed("empty archive")
        for operand in operands:
            pending = [operand]  # a stack, not recursion: a tree may be deeper than the limit
            while pending:
                pending.extend(reversed(await self._add(pending.pop(), out)))
        await out(tarstream.END_OF_ARCHIVE)
        if self.failed:
            raise _TarFailed("error exit delayed from previous errors")

    async def _add(self, path: str, out: Writer) -> list[str]:
        """Write one member; return the paths of a directory's entries, to add next."""
        try:
            info = self.fs.stat(path, self.base)
        except OSError as exc:
            await self.io.write_stderr(f"tar: {path}: {exc.strerror}\n".encode())
            self.failed = True
            return []
        name = _strip_unsafe_prefix(path)
        await self.warn_prefix(path, name)
        if name in ("", "."):
            name = "./" if info.is_dir else name
        if self.verbose:
            await self.io.write_stderr(f"{name}{'/' if info.is_dir and not name.endswith('/') else ''}\n".encode())
        if name:
            await out(tarstream.member_header(name, is_dir=info.is_dir, size=info.size if info.is_file else 0,
                                              mode=info.mode, mtime=info.mtime))
        if info.is_file:
            size = 0
            for chunk in self.fs.read_chunks(path, self.base):
                chunk = chunk[: info.size - size]  # as much as the header promised
                size += len(chunk)
                await out(chunk)
            await out(b"\0" * (info.size - size) + tarstream.padding(info.size))
        elif info.is_dir:
            return [path.rstrip("/") + "/" + child if path.rstrip("/") else "/" + child
                    for child in self.fs.listdir(path, self.base)]
        return []

    async def extract(self, read: Reader, *, list_only: bool) -> None:
        reader = tarstream.TarReader()
        writer: FileWriter | None = None
        member: tarstream.Member | None = None
        target = ""
        while not reader.ended:
            chunk = await read()
            if not chunk:
                if reader.in_member:
                    raise _TarFailed("short read")
                return
            try:
                events = reader.feed(chunk)
            except tarstream.TarError as exc:
                raise _TarFailed(str(exc)) from None
            for event in events:
                if isinstance(event, tarstream.Member):
                    member = event
                    name = _strip_unsafe_prefix(event.name)
                    await self.warn_prefix(event.name, name)
                    if list_only or self.verbose:
                        await self.io.write_stdout(f"{name}\n".encode())
                    writer, target = None, ""
                    if list_only or not name:
                        continue
                    target = self.fs.resolve(name, self.base)
                    writer = await self._start_member(event, target)
                elif isinstance(event, tarstream.Data):
                    if writer is not None:
                        try:
                            writer.write(event.data)
                        except OSError as exc:
                            raise _TarFailed(f"write error: {exc.strerror}") from None
                    elif self.to_stdout and member is not None and member.kind == "file":
                        await self.io.write_stdout(event.data)
                elif isinstance(event, tarstream.MemberEnd):
                    if member is not None and target and not list_only:
                        self._finish_member(member, target)
                    writer, member, target = None, None, ""
            await trio.lowlevel.checkpoint()

    async def _start_member(self, member: tarstream.Member, target: str) -> FileWriter | None:
        fs = self.fs
        try:
            if member.kind == "dir":
                fs.mkdir(target, parents=True, mode=member.mode)
                return None
            if member.kind != "file" or self.to_stdout:
                return None  # links and devices are not kept by kubesim's filesystem
            fs.mkdir(posixpath.dirname(target), parents=True)
            if fs.is_dir(target):
                raise OSError(errno.EISDIR, "Is a directory", target)
            return fs.open_write(target, mode=member.mode)
        except OSError as exc:
            raise _TarFailed(f"can't create '{member.name}': {exc.strerror}") from None

    def _finish_member(self, member: tarstream.Member, target: str) -> None:
        if member.kind not in ("dir", "file") or self.to_stdout:
            return
        try:
            self.fs.chmod(target, member.mode)
            if not self.keep_mtime:
                self.fs.touch(target, mtime_ns=int(member.mtime * 1_000_000_000))
        except OSError:
            pass


@_command("tar")
async def _tar(argv: Sequence[str], io: _Streams, env: Mapping[str, str]) -> int:
    args = list(argv[1:])
    if args and not args[0].startswith("-"):
        args[0] = "-" + args[0]  # the old style: `tar cf - dir`
    flags: set[str] = set()
    archive: str | None = None
    base = "."
    operands: list[str] = []
    while args:
        arg = args.pop(0)
        if arg.startswith("--"):
            if arg == "--":
                operands.extend(args)
                break
            if arg.startswith("--directory="):
                base = arg.partition("=")[2]
            elif arg.startswith("--file="):
                archive = arg.partition("=")[2]
            elif arg not in ("--no-same-permissions", "--no-same-owner", "--same-owner", "--overwrite",
                             "--touch", "--preserve-permissions", "--numeric-owner"):
                await io.write_stderr(f"tar: unrecognized option '{arg}'\n".encode())
                return 1
            continue
        if not arg.startswith("-") or arg == "-":
            operands.append(arg)
            continue
        for flag in arg[1:]:
            if flag in "fC":
                if not args:
                    await io.write_stderr(f"tar: option requires an argument -- '{flag}'\n".encode())
                    return 1
                value = args.pop(0)
                if flag == "f":
                    archive = value
                else:
                    base = value
            elif flag in "zjJ":
                await io.write_stderr(b"tar: compression is not supported by kubesim\n")
                return 1
            elif flag in "cxtvmopOkh":
                flags.add(flag)
            else:
                await io.write_stderr(f"tar: invalid option -- '{flag}'\n".encode())
                return 1
    modes = flags & {"c", "x", "t"}
    if len(modes) != 1:
        await io.write_stderr(b"tar: exactly one of 'c', 'x' or 't' must be specified\n")
        return 1
    fs = io.fs
    try:
        if not fs.stat(base, io.cwd).is_dir:
            raise OSError(errno.ENOTDIR, "Not a directory", base)
    except OSError as exc:
        await io.write_stderr(f"tar: can't change directory to '{base}': {exc.strerror}\n".encode())
        return 1
    tar = _Tar(io, base=fs.resolve(base, io.cwd), verbose="v" in flags, keep_mtime="m" in flags,
               to_stdout="O" in flags)
    try:
        if "c" in modes:
            if archive in (None, "-"):
                out = io.write_stdout
            else:
                try:
                    out = _file_writer(fs.open_write(archive, io.cwd))
                except OSError as exc:
                    raise _TarFailed(f"can't open '{archive}': {exc.strerror}") from None
            try:
                await tar.create(operands, out)
            except _WriteError as exc:
                raise _TarFailed(f"write error: {exc.error.strerror}") from None
        else:
            if archive in (None, "-"):
                read: Reader = io.read_stdin
            else:
                try:
                    read = _file_reader(fs.read_chunks(archive, io.cwd))
                except OSError as exc:
                    raise _TarFailed(f"can't open '{archive}': {exc.strerror}") from None
            await tar.extract(read, list_only="t" in modes)
    except _TarFailed as exc:
        await io.write_stderr(f"tar: {exc}\n".encode())
        return 1
    return 0


# -- sh: words, tokens, syntax -------------------------------------------------------------------


class ShellSyntaxError(Exception):
    """A script this shell cannot parse; `incomplete` when more input could complete it."""

    def __init__(self, message: str, *, incomplete: bool = False) -> None:
        super().__init__(message)
        self.incomplete = incomplete


@attrs.frozen
class _Lit:
    text: str
    quoted: bool


@attrs.frozen
class _Param:
    name: str
    quoted: bool


@attrs.frozen
class _Subst:
    script: _Script
    quoted: bool


_Part = _Lit | _Param | _Subst


@attrs.frozen
class _Word:
    parts: tuple[_Part, ...]

    def literal(self) -> str | None:
        """The word's text if it involves no expansion and no quoting."""
        if all(isinstance(p, _Lit) and not p.quoted for p in self.parts):
            return "".join(p.text for p in self.parts)  # type: ignore[union-attr]
        return None


@attrs.frozen
class _Redirect:
    fd: int
    op: str  # ">", ">>", "<", ">&", "<&"
    target: _Word


@attrs.frozen
class _Simple:
    assignments: tuple[tuple[str, _Word], ...]
    words: tuple[_Word, ...]
    redirects: tuple[_Redirect, ...]


@attrs.frozen
class _Pipeline:
    commands: tuple[_Simple, ...]
    negate: bool = False


@attrs.frozen
class _AndOr:
    first: _Pipeline
    rest: tuple[tuple[str, _Pipeline], ...]  # ("&&" | "||", pipeline)
    background: bool = False


@attrs.frozen
class _Script:
    items: tuple[_AndOr, ...]


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SPECIAL_PARAMS = set("?$#@*!0123456789-")
_OPERATORS = ("&&", "||", ";;", ";", "|", "&", "\n", "(", ")")
_UNSUPPORTED_WORDS = {"if", "then", "else", "elif", "fi", "for", "while", "until", "do", "done",
                      "case", "esac", "function"}


_REDIRECT = re.compile(r"(\d?)(>>|>&|<&|>|<)")


class _Lexer:
    """Splits a script into words, operators and redirects, the way a POSIX shell does."""

    def __init__(self, source: str) -> None:
        self.src = source
        self.pos = 0

    def tokens(self) -> list[_Word | str | _Redirect]:
        out: list[_Word | str | _Redirect] = []
        while True:
            self._skip_blanks()
            if self.pos >= len(self.src):
                return out
            char = self.src[self.pos]
            if char == "#":
                while self.pos < len(self.src) and self.src[self.pos] != "\n":
                    self.pos += 1
                continue
            op = next((o for o in _OPERATORS if self.src.startswith(o, self.pos)), None)
            if op is not None:
                self.pos += len(op)
                out.append(op)
                continue
            redirect = self._redirect()
            if redirect is not None:
                out.append(redirect)
                continue
            out.append(self._word())

    def _skip_blanks(self) -> None:
        while self.pos < len(self.src):
            if self.src[self.pos] in " \t":
                self.pos += 1
            elif self.src.startswith("\\\n", self.pos):
                self.pos += 2
            else:
                return

    def _redirect(self) -> _Redirect | None:
        match = _REDIRECT.match(self.src, self.pos)
        if match is None:
            return None
        fd_text, op = match.groups()
        self.pos = match.end()
        fd = int(fd_text) if fd_text else (0 if op[0] == "<" else 1)
        self._skip_blanks()
        if self.pos >= len(self.src):
            raise ShellSyntaxError("syntax error: unexpected end of file")
        if self.src[self.pos] in ";&|\n()<>":
            near = "newline" if self.src[self.pos] == "\n" else self.src[self.pos]
            raise ShellSyntaxError(f'syntax error: unexpected "{near}"')
        return _Redirect(fd=fd, op=op, target=self._word())

    def _word(self) -> _Word:
        parts: list[_Part] = []
        literal: list[str] = []

        def flush(quoted: bool = False) -> None:
            if literal:
                parts.append(_Lit("".join(literal), quoted))
                literal.clear()

        src = self.src
        while self.pos < len(src):
            char = src[self.pos]
            if char in " \t\n;&|()<>":
                break
            if char == "\\":
                if self.pos + 1 < len(src):
                    if src[self.pos + 1] != "\n":
                        flush()
                        parts.append(_Lit(src[self.pos + 1], True))
                    self.pos += 2
                else:
                    literal.append("\\")
                    self.pos += 1
            elif char == "'":
                end = src.find("'", self.pos + 1)
                if end < 0:
                    raise ShellSyntaxError("syntax error: unterminated quoted string", incomplete=True)
                flush()
                parts.append(_Lit(src[self.pos + 1 : end], True))
                self.pos = end + 1
            elif char == '"':
                flush()
                self.pos += 1
                parts.extend(self._double_quoted())
            elif char == "$" or char == "`":
                part = self._dollar()
                if part is None:
                    literal.append(char)
                    self.pos += 1
                else:
                    flush()
                    parts.append(part)
            else:
                literal.append(char)
                self.pos += 1
        flush()
        if not parts:  # only a line continuation: nothing
            parts.append(_Lit("", False))
        return _Word(tuple(parts))

    def _double_quoted(self) -> list[_Part]:
        parts: list[_Part] = []
        literal: list[str] = []
        src = self.src
        while True:
            if self.pos >= len(src):
                raise ShellSyntaxError("syntax error: unterminated quoted string", incomplete=True)
            char = src[self.pos]
            if char == '"':
                self.pos += 1
                break
            if char == "\\" and self.pos + 1 < len(src) and src[self.pos + 1] in '$`"\\\n':
                if src[self.pos + 1] != "\n":
                    literal.append(src[self.pos + 1])
                self.pos += 2
            elif char in "$`":
                part = self._dollar(quoted=True)
                if part is None:
                    literal.append(char)
                    self.pos += 1
                else:
                    if literal:
                        parts.append(_Lit("".join(literal), True))
                        literal.clear()
                    parts.append(part)
            else:
                literal.append(char)
                self.pos += 1
        # An empty "" still makes a (quoted, empty) word.
        parts.append(_Lit("".join(literal), True))
        return parts

    def _dollar(self, *, quoted: bool = False) -> _Part | None:
        src, start = self.src, self.pos
        if src[start] == "`":
            end = src.find("`", start + 1)
            if end < 0:
                raise ShellSyntaxError("syntax error: unterminated `", incomplete=True)
            self.pos = end + 1
            return _Subst(parse_script(src[start + 1 : end]), quoted)
        nxt = src[start + 1 : start + 2]
        if nxt == "(":
            if src.startswith("$((", start):
                raise ShellSyntaxError("arithmetic expansion $((...)) is not supported")
            end = _matching_paren(src, start + 2)
            self.pos = end + 1
            return _Subst(parse_script(src[start + 2 : end]), quoted)
        if nxt == "{":
            end = src.find("}", start + 2)
            if end < 0:
                raise ShellSyntaxError("syntax error: missing '}'", incomplete=True)
            name = src[start + 2 : end]
            if not (_NAME.fullmatch(name) or name in _SPECIAL_PARAMS or name.isdigit()):
                raise ShellSyntaxError(f"{src[start:end + 1]}: bad substitution")
            self.pos = end + 1
            return _Param(name, quoted)
        if nxt and nxt in _SPECIAL_PARAMS:
            self.pos = start + 2
            return _Param(nxt, quoted)
        match = _NAME.match(src, start + 1)
        if match is None:
            return None
        self.pos = match.end()
        return _Param(match.group(0), quoted)


def _matching_paren(src: str, pos: int) -> int:
    depth, quote = 1, ""
    while pos < len(src):
        char = src[pos]
        if quote:
            if char == quote:
                quote = ""
            elif char == "\\" and quote == '"':
                pos += 1
        elif char in "'\"":
            quote = char
        elif char == "\\":
            pos += 1
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return pos
        pos += 1
    raise ShellSyntaxError("syntax error: unterminated $(", incomplete=True)


def parse_script(source: str) -> _Script:
    """Parse `source`; raises ShellSyntaxError."""
    tokens = _Lexer(source).tokens()
    pos = 0

    def peek() -> _Word | str | _Redirect | None:
        return tokens[pos] if pos < len(tokens) else None

    def unexpected(token: object) -> ShellSyntaxError:
        if token is None:
            return ShellSyntaxError("syntax error: unexpected end of file", incomplete=True)
        shown = "newline" if token == "\n" else token
        return ShellSyntaxError(f'syntax error: unexpected "{shown}"')

    def simple() -> _Simple:
        nonlocal pos
        assignments: list[tuple[str, _Word]] = []
        words: list[_Word] = []
        redirects: list[_Redirect] = []
        while True:
            token = peek()
            if isinstance(token, _Redirect):
                redirects.append(token)
            elif isinstance(token, _Word):
                first = token.parts[0]
                if (
                    not words
                    and isinstance(first, _Lit)
                    and not first.quoted
                    and re.match(r"[A-Za-z_][A-Za-z0-9_]*=", first.text)
                ):
                    name, _, rest = first.text.partition("=")
                    value_parts = ((_Lit(rest, False),) if rest else ()) + token.parts[1:]
                    assignments.append((name, _Word(value_parts or (_Lit("", True),))))
                else:
                    if not words and token.literal() in _UNSUPPORTED_WORDS:
                        raise ShellSyntaxError(
                            f"'{token.literal()}' compound commands are not supported by this shell"
                        )
                    words.append(token)
            else:
                break
            pos += 1
        if not (assignments or words or redirects):
            raise unexpected(peek())
        return _Simple(tuple(assignments), tuple(words), tuple(redirects))

    def pipeline() -> _Pipeline:
        nonlocal pos
        negate = False
        token = peek()
        if isinstance(token, _Word) and token.literal() == "!":
            negate = True
            pos += 1
        commands = [simple()]
        while peek() == "|":
            pos += 1
            while peek() == "\n":
                pos += 1
            commands.append(simple())
        return _Pipeline(tuple(commands), negate)

    def and_or() -> _AndOr:
        nonlocal pos
        first = pipeline()
        rest: list[tuple[str, _Pipeline]] = []
        while peek() in ("&&", "||"):
            op = tokens[pos]
            assert isinstance(op, str)
            pos += 1
            while peek() == "\n":
                pos += 1
            rest.append((op, pipeline()))
        return _AndOr(first, tuple(rest))

    items: list[_AndOr] = []
    while True:
        while peek() in (";", "\n") and (peek() == "\n" or items):
            if peek() == ";" and pos > 0 and tokens[pos - 1] in (";", "\n", "&"):
                raise unexpected(";")
            pos += 1
        token = peek()
        if token is None:
            return _Script(tuple(items))
        if isinstance(token, str) and token not in ("\n",):
            raise unexpected(token)
        item = and_or()
        if peek() == "&":
            pos += 1
            item = attrs.evolve(item, background=True)
        elif peek() not in (None, ";", "\n"):
            raise unexpected(peek())
        items.append(item)


# -- sh: running ---------------------------------------------------------------------------------


class _ExitShell(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


_PIPE_BUFFER = 16


class _Shell:
    def __init__(self, *, env: Mapping[str, str], name: str = "sh") -> None:
        self.vars: dict[str, str] = dict(env)
        self.exported: set[str] = set(env)
        self.name = name
        self.positional: list[str] = []
        self.status = 0
        self.errexit = False
        self.jobs: list[trio.Event] = []
        self.cwd = "/"

    def set_option(self, option: str) -> None:
        if "e" in option[1:]:
            self.errexit = option[0] == "-"

    def child(self) -> _Shell:
        """A subshell: a copy of the state that cannot change ours."""
        copy = _Shell(env={}, name=self.name)
        copy.vars, copy.exported = dict(self.vars), set(self.exported)
        copy.positional, copy.status, copy.errexit = list(self.positional), self.status, self.errexit
        copy.cwd = self.cwd
        return copy

    def environment(self) -> dict[str, str]:
        return {k: v for k, v in self.vars.items() if k in self.exported}

    async def error(self, io: _Streams, message: str) -> None:
        await io.write_stderr(f"{self.name}: {message}\n".encode())

    async def run_source(self, source: str, io: CommandIO) -> int:
        streams = _streams(io)
        try:
            script = parse_script(source)
        except ShellSyntaxError as exc:
            await self.error(streams, str(exc))
            return 2
        try:
            return await self.run_script(script, streams)
        except _ExitShell as exc:
            return exc.status

    async def run_script(self, script: _Script, io: _Streams) -> int:
        exit_request: _ExitShell | None = None
        async with trio.open_nursery() as nursery:
            for item in script.items:
                if item.background:
                    done = trio.Event()
                    self.jobs.append(done)
                    nursery.start_soon(self._background, item, io, done)
                    self.status = 0
                    continue
                try:
                    self.status = await self.run_and_or(item, io)
                    if self.errexit and self.status != 0 and not item.rest:
                        raise _ExitShell(self.status)
                except _ExitShell as exc:
                    # Re-raised outside the nursery, so it is not wrapped in a group.
                    exit_request = exc
                    break
            # Like orphans of a shell that ended, background jobs do not outlive the script.
            nursery.cancel_scope.cancel()
        if exit_request is not None:
            raise exit_request
        return self.status

    async def _background(self, item: _AndOr, io: _Streams, done: trio.Event) -> None:
        try:
            await self.child().run_and_or(item, io)
        except (_ExitShell, _BrokenPipe):
            pass
        finally:
            done.set()

    async def run_and_or(self, item: _AndOr, io: _Streams) -> int:
        status = await self.run_pipeline(item.first, io)
        for op, pipeline in item.rest:
            self.status = status
            if (op == "&&") == (status == 0):
                status = await self.run_pipeline(pipeline, io)
        return status

    async def run_pipeline(self, pipeline: _Pipeline, io: _Streams) -> int:
        if len(pipeline.commands) == 1:
            status = await self.run_simple(pipeline.commands[0], io)
        else:
            status = await self._run_stages(pipeline.commands, io)
        if pipeline.negate:
            status = int(status == 0)
        return status

    async def _run_stages(self, commands: Sequence[_Simple], io: _Streams) -> int:
        statuses = [0] * len(commands)

        async def stage(index: int, streams: _Streams, ends: list[_PipeEnd]) -> None:
            try:
                statuses[index] = await self.child().run_simple(commands[index], streams)
            except _ExitShell as exc:
                statuses[index] = exc.status
            except _BrokenPipe:
                statuses[index] = 128 + 13
            finally:
                # EOF for the next stage; a broken pipe for the previous one.
                for end in ends:
                    end.close()

        async with trio.open_nursery() as nursery:
            stdin = io.stdin
            upstream: _PipeEnd | None = None
            for index in range(len(commands)):
                ends: list[_PipeEnd] = [upstream] if upstream is not None else []
                streams = io.replace(stdin=stdin)
                if index < len(commands) - 1:
                    send, receive = trio.open_memory_channel[bytes](_PIPE_BUFFER)
                    ends.append(send)
                    streams = streams.replace(write_stdout=_pipe_writer(send))
                    stdin, upstream = _Stdin(_pipe_reader(receive)), receive
                nursery.start_soon(stage, index, streams, ends)
        return statuses[-1]

    async def expand(self, word: _Word, io: _Streams) -> list[str]:
        """Expand parameters and substitutions, then split unquoted results into fields."""
        fields: list[list[str]] = [[]]
        keep = [False]
        for part in word.parts:
            if isinstance(part, _Lit):
                fields[-1].append(part.text)
                keep[-1] = keep[-1] or part.quoted or bool(part.text)
                continue
            value = self.param(part.name) if isinstance(part, _Param) else await self.substitute(part.script, io)
            if part.quoted:
                fields[-1].append(value)
                keep[-1] = True
                continue
            pieces = value.split()
            if not pieces:
                continue
            if value[0].isspace() and (fields[-1] or keep[-1]):
                fields.append([])
                keep.append(False)
            for i, piece in enumerate(pieces):
                if i:
                    fields.append([])
                    keep.append(False)
                fields[-1].append(piece)
                keep[-1] = True
            if value[-1].isspace():
                fields.append([])
                keep.append(False)
        return ["".join(f) for f, k in zip(fields, keep, strict=True) if k]

    async def expand_one(self, word: _Word, io: _Streams) -> str:
        return " ".join(await self.expand(word, io))

    def param(self, name: str) -> str:
        if name == "?":
            return str(self.status)
        if name == "$":
            return "1"
        if name == "#":
            return str(len(self.positional))
        if name in ("@", "*"):
            return " ".join(self.positional)
        if name == "0":
            return self.name
        if name.isdigit():
            index = int(name) - 1
            return self.positional[index] if index < len(self.positional) else ""
        if name in ("!", "-"):
            return ""
        return self.vars.get(name, "")

    async def substitute(self, script: _Script, io: _Streams) -> str:
        captured = bytearray()

        async def capture(data: bytes) -> None:
            await trio.lowlevel.checkpoint()
            captured.extend(data)

        sub = self.child()
        try:
            self.status = await sub.run_script(script, io.replace(write_stdout=capture))
        except _ExitShell as exc:
            self.status = exc.status
        return captured.decode("utf-8", "replace").rstrip("\n")

    async def run_simple(self, command: _Simple, io: _Streams) -> int:
        io = io.replace(cwd=self.cwd)
        try:
            io = await self.redirect(command.redirects, io)
        except _RedirectError as exc:
            await self.error(io, str(exc))
            return 1
        values = [(name, await self.expand_one(word, io)) for name, word in command.assignments]
        argv: list[str] = []
        for word in command.words:
            argv.extend(await self.expand(word, io))
        if not argv:
            for name, value in values:
                self.vars[name] = value
            return self.status if command.assignments and any(
                any(isinstance(p, _Subst) for p in w.parts) for _, w in command.assignments
            ) else 0
        builtin = _SHELL_BUILTINS.get(argv[0])
        if builtin is not None:
            for name, value in values:
                self.vars[name] = value
            return await builtin(self, argv, io)
        env = self.environment()
        env.update(values)
        if _lookup(argv[0]) is None:
            await self.error(io, f"{argv[0]}: not found")
            return 127
        return await run_command(argv, io, env)

    async def redirect(self, redirects: Sequence[_Redirect], io: _Streams) -> _Streams:
        fds: dict[int, Writer | _Stdin] = {0: io.stdin, 1: io.write_stdout, 2: io.write_stderr}
        for redirect in redirects:
            target = await self.expand_one(redirect.target, io)
            if redirect.op in (">&", "<&"):
                if target == "-":
                    fds[redirect.fd] = _Stdin(_empty) if redirect.fd == 0 else _discard
                    continue
                if not target.isdigit() or int(target) not in fds:
                    raise _RedirectError(f"{target}: bad file descriptor" if target.isdigit() else f"{target}: bad number")
                fds[redirect.fd] = fds[int(target)]
            elif redirect.op == "<":
                try:
                    if io.fs.is_dir(target, self.cwd):
                        raise OSError(errno.EISDIR, "Is a directory", target)
                    chunks = io.fs.read_chunks(target, self.cwd)
                except OSError as exc:
                    raise _RedirectError(f"can't open {target}: {_ash_errmsg(exc, 'no such file')}") from None
                fds[redirect.fd] = _Stdin(_file_reader(chunks))
            elif target == "/dev/null":
                fds[redirect.fd] = _discard
            elif target in ("/dev/stdout", "/proc/self/fd/1"):
                fds[redirect.fd] = fds[1]
            elif target in ("/dev/stderr", "/proc/self/fd/2"):
                fds[redirect.fd] = fds[2]
            else:
                try:
                    writer = io.fs.open_write(target, self.cwd, append=redirect.op == ">>")
                except OSError as exc:
                    raise _RedirectError(
                        f"can't create {target}: {_ash_errmsg(exc, 'nonexistent directory')}") from None
                fds[redirect.fd] = _file_writer(writer)
        stdin, out, err = fds[0], fds[1], fds[2]
        return io.replace(
            stdin=stdin if isinstance(stdin, _Stdin) else _Stdin(_empty),
            write_stdout=out if not isinstance(out, _Stdin) else _discard,
            write_stderr=err if not isinstance(err, _Stdin) else _discard,
        )

    async def interact(self, io: CommandIO) -> int:
        """The shell without -c: read commands from stdin, prompting when on a terminal.

        On a terminal, ^C is the shell's to handle (busybox ash, interactive): it ends the
        command in the foreground, whose status is then 130 (128 + SIGINT), or drops the line
        being typed; either way a new prompt follows and the shell goes on. ^D on an empty line
        ends it.
        """
        streams = _streams(io)
        interrupts = streams.interrupts if streams.tty else None
        prompt = (self.vars.get("PS1") or "/ # ").encode()
        while True:
            if streams.tty:
                await streams.write_stderr(prompt)
            with _foreground(interrupts) as reading:
                source = ""
                script: _Script | None = None
                while True:
                    line, complete = await streams.stdin.read_line()
                    if not complete and not line and not source:
                        return self.status
                    source += line.decode("utf-8", "replace") + "\n"
                    try:
                        script = parse_script(source)
                    except ShellSyntaxError as exc:
                        if exc.incomplete and complete:
                            if streams.tty:
                                await streams.write_stderr(b"> ")
                            continue
                        await self.error(streams, str(exc))
                        self.status = 2
                    break
            if reading.cancelled_caught:
                self.status = 128 + 2  # ^C at the prompt: the line is dropped
                continue
            if script is not None:
                with _foreground(interrupts) as running:
                    try:
                        await self.run_script(script, streams)
                    except _ExitShell as exc:
                        return exc.status
                if running.cancelled_caught:
                    self.status = 128 + 2  # the foreground command died of SIGINT
            if not complete:
                return self.status


@contextlib.contextmanager
def _foreground(interrupts: Interrupts | None) -> Iterator[trio.CancelScope]:
    """A cancel scope that a ^C on the terminal cancels while it is the innermost foreground."""
    with trio.CancelScope() as scope:
        if interrupts is None:
            yield scope
            return
        with interrupts.foreground(scope.cancel):
            yield scope


_PipeEnd = trio.MemorySendChannel[bytes] | trio.MemoryReceiveChannel[bytes]


def _pipe_writer(send: trio.MemorySendChannel[bytes]) -> Writer:
    async def write(data: bytes) -> None:
        try:
            await send.send(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise _BrokenPipe from None

    return write


def _pipe_reader(receive: trio.MemoryReceiveChannel[bytes]) -> Reader:
    async def read() -> bytes:
        try:
            return await receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            return b""

    return read


class _RedirectError(Exception):
    pass


def _ash_errmsg(exc: OSError, missing: str) -> str:
    """busybox ash's errmsg(): its own words for a missing file or directory, else strerror."""
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return missing
    return exc.strerror or str(exc)


Builtin = Callable[[_Shell, list[str], _Streams], Awaitable[int]]


async def _builtin_exit(shell: _Shell, argv: list[str], io: _Streams) -> int:
    await trio.lowlevel.checkpoint()
    if len(argv) < 2:
        raise _ExitShell(shell.status)
    try:
        status = int(argv[1]) & 0xFF
    except ValueError:
        await shell.error(io, f"exit: Illegal number: {argv[1]}")
        raise _ExitShell(2) from None
    raise _ExitShell(status)


async def _builtin_export(shell: _Shell, argv: list[str], io: _Streams) -> int:
    await trio.lowlevel.checkpoint()
    for arg in argv[1:]:
        if arg == "-p":
            continue
        name, eq, value = arg.partition("=")
        if not _NAME.fullmatch(name):
            await shell.error(io, f"export: bad variable name: {name}")
            return 2
        if eq:
            shell.vars[name] = value
        shell.exported.add(name)
    return 0


async def _builtin_unset(shell: _Shell, argv: list[str], io: _Streams) -> int:
    await trio.lowlevel.checkpoint()
    for name in argv[1:]:
        if name in ("-v", "-f"):
            continue
        shell.vars.pop(name, None)
        shell.exported.discard(name)
    return 0


async def _builtin_set(shell: _Shell, argv: list[str], io: _Streams) -> int:
    await trio.lowlevel.checkpoint()
    args = argv[1:]
    while args and re.fullmatch(r"[-+][a-z]*", args[0]):
        option = args.pop(0)
        if option in ("-", "--"):
            break
        shell.set_option(option)
    if args:
        shell.positional = list(args)
    return 0


async def _builtin_cd(shell: _Shell, argv: list[str], io: _Streams) -> int:
    await trio.lowlevel.checkpoint()
    target = argv[1] if len(argv) > 1 else shell.vars.get("HOME", "/")
    if target == "-":
        target = shell.vars.get("OLDPWD", shell.cwd)
        await io.write_stdout(f"{target}\n".encode())
    try:
        if not io.fs.stat(target, shell.cwd).is_dir:
            raise OSError(errno.ENOTDIR, "Not a directory", target)
    except OSError as exc:
        await shell.error(io, f"cd: can't cd to {target}: {exc.strerror}")
        return 2
    shell.vars["OLDPWD"] = shell.cwd
    shell.cwd = io.fs.resolve(target, shell.cwd)
    shell.vars["PWD"] = shell.cwd
    return 0


async def _builtin_read(shell: _Shell, argv: list[str], io: _Streams) -> int:
    names = [a for a in argv[1:] if not a.startswith("-")] or ["REPLY"]
    line, complete = await io.stdin.read_line()
    text = line.decode("utf-8", "replace")
    values = text.split(None, len(names) - 1) if len(names) > 1 else [text.strip()]
    for i, name in enumerate(names):
        shell.vars[name] = values[i] if i < len(values) else ""
    return 0 if complete else 1


async def _builtin_wait(shell: _Shell, argv: list[str], io: _Streams) -> int:
    await trio.lowlevel.checkpoint()
    for job in shell.jobs:
        await job.wait()
    shell.jobs.clear()
    return 0


_SHELL_BUILTINS: dict[str, Builtin] = {
    "exit": _builtin_exit,
    "export": _builtin_export,
    "unset": _builtin_unset,
    "set": _builtin_set,
    "cd": _builtin_cd,
    "read": _builtin_read,
    "wait": _builtin_wait,
}


# -- a terminal ----------------------------------------------------------------------------------


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
        self._send, self._receive = trio.open_memory_channel[bytes](_PIPE_BUFFER)

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
