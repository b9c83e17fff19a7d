"""The busybox-like commands a container can run, but for the file commands (`files`):
echo, cat, env, printf, test, head, tail, sort, grep, sleep, httpd, `sh` (the `interpreter`), ….
Messages and exit statuses follow busybox.
"""

from __future__ import annotations

import errno
import functools
import math
import posixpath
import re
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime

import trio

# stdio.MAX_INPUT is read at each call (a test lowers it), so the module, not the name, is imported.
import kubesim.shell.stdio as stdio
from kubesim import httpservers, netsim
from kubesim.fs import Stat
from kubesim.shell.commands import command, is_command, run_command
from kubesim.shell.interpreter import Shell
from kubesim.shell.stdio import Streams, command_name

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


@command("echo")
async def _echo(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
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


@command("cat")
async def _cat(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
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


@command("env", "printenv")
async def _env(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
    if command_name(argv) == "printenv":
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


@command("date")
async def _date(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
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


@command("sleep")
async def _sleep(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
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


@command("true", ":")
async def _true(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
    await trio.lowlevel.checkpoint()
    return 0


@command("false")
async def _false(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
    await trio.lowlevel.checkpoint()
    return 1


@command("exit")
async def _exit(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
    await trio.lowlevel.checkpoint()
    if len(argv) < 2:
        return 0
    try:
        return int(argv[1]) & 0xFF
    except ValueError:
        await io.write_stderr(f"sh: exit: Illegal number: {argv[1]}\n".encode())
        return 2


@command("hostname")
async def _hostname(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
    await io.write_stdout((env.get("HOSTNAME", "localhost") + "\n").encode())
    return 0


@command("pwd")
async def _pwd(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
    await io.write_stdout((io.cwd + "\n").encode())
    return 0


@command("whoami")
async def _whoami(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
    await io.write_stdout(b"root\n")
    return 0


@command("id")
async def _id(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
    await io.write_stdout(b"uid=0(root) gid=0(root) groups=0(root),10(wheel)\n")
    return 0


@command("uname")
async def _uname(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
    await io.write_stdout(b"Linux\n")
    return 0


_PRINTF_SPEC = re.compile(r"%([-+ 0#]*)(\d*)(?:\.(\d+))?([sdicxXoeEfgGb%])")


@command("printf")
async def _printf(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
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


@command("test", "[")
async def _test(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
    await trio.lowlevel.checkpoint()
    args = list(argv[1:])
    if command_name(argv) == "[":
        if not args or args[-1] != "]":
            await io.write_stderr(b"[: missing ]\n")
            return 2
        args.pop()
    try:
        return 0 if _evaluate_test(args, io) else 1
    except ValueError as exc:
        await io.write_stderr(f"sh: {exc}\n".encode())
        return 2


def _evaluate_test(args: list[str], io: Streams) -> bool:
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
    name: str, paths: Sequence[str], io: Streams, env: Mapping[str, str]
) -> tuple[bytes, int]:
    """All of the named files (or stdin) and an exit status; missing files are reported."""
    files = list(paths) or ["-"]
    data, status = bytearray(), 0
    for path in files:
        if path == "-":
            # Bounded as files are: `yes | sort` or an endless `exec -i` stream must not
            # grow kubesim's memory without end.
            while chunk := await io.read_stdin():
                if len(data) + len(chunk) > stdio.MAX_INPUT:
                    await io.write_stderr(f"{name}: -: File too large\n".encode())
                    return bytes(data), 1
                data += chunk
            continue
        try:
            chunks = io.fs.read_chunks(path, io.cwd)
            for chunk in chunks:
                if len(data) + len(chunk) > stdio.MAX_INPUT:
                    raise OSError(errno.EFBIG, "File too large", path)
                data += chunk
        except OSError as exc:
            await io.write_stderr(f"{name}: {path}: {exc.strerror}\n".encode())
            status = 1
    return bytes(data), status


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


@command("head")
async def _head(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
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
    while newlines < count and len(buffer) <= stdio.MAX_INPUT and (chunk := await io.read_stdin()):
        buffer += chunk  # bounded: a stream without newlines stops at MAX_INPUT
        newlines += chunk.count(b"\n")
    lines = bytes(buffer).split(b"\n")
    await io.write_stdout(b"\n".join(lines[:count]) + (b"\n" if len(lines) > count else b""))
    return 0


@command("tail")
async def _tail(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
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


@command("wc")
async def _wc(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
    flags = "".join(a[1:] for a in argv[1:] if a.startswith("-") and a != "-") or "lwc"
    files = [a for a in argv[1:] if not a.startswith("-") or a == "-"]
    data, status = await _inputs("wc", files, io, env)
    counts = {"l": data.count(b"\n"), "w": len(data.split()), "c": len(data)}
    fields = [counts[f] for f in "lwc" if f in flags]
    text = f"{fields[0]}" if len(fields) == 1 else " ".join(f"{n:>7}" for n in fields)
    await io.write_stdout((text + "\n").encode())
    return status


@command("sort")
async def _sort(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
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


@command("grep")
async def _grep(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
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


@command("seq")
async def _seq(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
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


@command("httpd")
async def _httpd(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
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


@command("yes")
async def _yes(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
    line = ((" ".join(argv[1:]) or "y") + "\n").encode()
    block = line * max(1, 4096 // len(line))
    while True:
        await io.write_stdout(block)


@command("sh", "ash", "bash")
async def _sh(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
    args = list(argv[1:])
    options: list[str] = []
    while args and re.fullmatch(r"[-+][a-z]+", args[0]) and args[0] != "-c":
        options.append(args.pop(0))
    shell = Shell(env=env, name=command_name(argv))
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
