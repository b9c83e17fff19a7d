"""The file commands over the container's filesystem: ls, mkdir, rmdir, rm, touch, chmod, cp,
mv and tar (what `kubectl cp` runs). Messages and exit statuses follow busybox.
"""

from __future__ import annotations

import errno
import posixpath
import re
import stat
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

import trio

from kubesim import tarstream
from kubesim.fs import FileSystem, FileWriter, Stat
from kubesim.shell.commands import command
from kubesim.shell.stdio import (
    Reader,
    Streams,
    WriteError,
    Writer,
    command_name,
    file_reader,
    file_writer,
)


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
                    return f"{command_name(argv)}: invalid option -- '{flag}'"
                flags.add(flag)
        else:
            operands.append(arg)
    return flags, operands


async def _usage_error(io: Streams, message: str) -> int:
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


@command("ls")
async def _ls(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
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


@command("mkdir")
async def _mkdir(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
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


@command("rmdir")
async def _rmdir(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
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


@command("rm")
async def _rm(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
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


@command("touch")
async def _touch(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
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


@command("chmod")
async def _chmod(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
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


@command("cp", "mv")
async def _cp(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
    name = command_name(argv)
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

    def __init__(self, io: Streams, *, base: str, verbose: bool, keep_mtime: bool, to_stdout: bool) -> None:
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


@command("tar")
async def _tar(argv: Sequence[str], io: Streams, env: Mapping[str, str]) -> int:
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
                    out = file_writer(fs.open_write(archive, io.cwd))
                except OSError as exc:
                    raise _TarFailed(f"can't open '{archive}': {exc.strerror}") from None
            try:
                await tar.create(operands, out)
            except WriteError as exc:
                raise _TarFailed(f"write error: {exc.error.strerror}") from None
        else:
            if archive in (None, "-"):
                read: Reader = io.read_stdin
            else:
                try:
                    read = file_reader(fs.read_chunks(archive, io.cwd))
                except OSError as exc:
                    raise _TarFailed(f"can't open '{archive}': {exc.strerror}") from None
            await tar.extract(read, list_only="t" in modes)
    except _TarFailed as exc:
        await io.write_stderr(f"tar: {exc}\n".encode())
        return 1
    return 0
