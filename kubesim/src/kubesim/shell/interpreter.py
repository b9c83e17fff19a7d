"""`sh` running a parsed `Script`: expansions, pipelines, redirects, background jobs, `set -e`,
the shell's own built-ins (`exit`, `export`, `unset`, `set`, `cd`, `read`, `wait`) and the
interactive loop (prompts, ^C for the foreground command). Commands it does not hold itself
run through `commands.run_command`.
"""

from __future__ import annotations

import contextlib
import errno
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence

import trio

from kubesim.shell.commands import lookup, run_command, streams_of
from kubesim.shell.parser import (
    NAME,
    AndOr,
    Lit,
    Param,
    Pipeline,
    Redirect,
    Script,
    ShellSyntaxError,
    Simple,
    Subst,
    Word,
    parse_script,
)
from kubesim.shell.stdio import (
    PIPE_BUFFER,
    BrokenPipe,
    CommandIO,
    Interrupts,
    Reader,
    Stdin,
    Streams,
    Writer,
    discard,
    file_reader,
    file_writer,
    read_nothing,
)


class ExitShell(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class Shell:
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

    def child(self) -> Shell:
        """A subshell: a copy of the state that cannot change ours."""
        copy = Shell(env={}, name=self.name)
        copy.vars, copy.exported = dict(self.vars), set(self.exported)
        copy.positional, copy.status, copy.errexit = list(self.positional), self.status, self.errexit
        copy.cwd = self.cwd
        return copy

    def environment(self) -> dict[str, str]:
        return {k: v for k, v in self.vars.items() if k in self.exported}

    async def error(self, io: Streams, message: str) -> None:
        await io.write_stderr(f"{self.name}: {message}\n".encode())

    async def run_source(self, source: str, io: CommandIO) -> int:
        streams = streams_of(io)
        try:
            script = parse_script(source)
        except ShellSyntaxError as exc:
            await self.error(streams, str(exc))
            return 2
        try:
            return await self.run_script(script, streams)
        except ExitShell as exc:
            return exc.status

    async def run_script(self, script: Script, io: Streams) -> int:
        exit_request: ExitShell | None = None
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
                        raise ExitShell(self.status)
                except ExitShell as exc:
                    # Re-raised outside the nursery, so it is not wrapped in a group.
                    exit_request = exc
                    break
            # Like orphans of a shell that ended, background jobs do not outlive the script.
            nursery.cancel_scope.cancel()
        if exit_request is not None:
            raise exit_request
        return self.status

    async def _background(self, item: AndOr, io: Streams, done: trio.Event) -> None:
        try:
            await self.child().run_and_or(item, io)
        except (ExitShell, BrokenPipe):
            pass
        finally:
            done.set()

    async def run_and_or(self, item: AndOr, io: Streams) -> int:
        status = await self.run_pipeline(item.first, io)
        for op, pipeline in item.rest:
            self.status = status
            if (op == "&&") == (status == 0):
                status = await self.run_pipeline(pipeline, io)
        return status

    async def run_pipeline(self, pipeline: Pipeline, io: Streams) -> int:
        if len(pipeline.commands) == 1:
            status = await self.run_simple(pipeline.commands[0], io)
        else:
            status = await self._run_stages(pipeline.commands, io)
        if pipeline.negate:
            status = int(status == 0)
        return status

    async def _run_stages(self, commands: Sequence[Simple], io: Streams) -> int:
        statuses = [0] * len(commands)

        async def stage(index: int, streams: Streams, ends: list[_PipeEnd]) -> None:
            try:
                statuses[index] = await self.child().run_simple(commands[index], streams)
            except ExitShell as exc:
                statuses[index] = exc.status
            except BrokenPipe:
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
                    send, receive = trio.open_memory_channel[bytes](PIPE_BUFFER)
                    ends.append(send)
                    streams = streams.replace(write_stdout=_pipe_writer(send))
                    stdin, upstream = Stdin(_pipe_reader(receive)), receive
                nursery.start_soon(stage, index, streams, ends)
        return statuses[-1]

    async def expand(self, word: Word, io: Streams) -> list[str]:
        """Expand parameters and substitutions, then split unquoted results into fields."""
        fields: list[list[str]] = [[]]
        keep = [False]
        for part in word.parts:
            if isinstance(part, Lit):
                fields[-1].append(part.text)
                keep[-1] = keep[-1] or part.quoted or bool(part.text)
                continue
            value = self.param(part.name) if isinstance(part, Param) else await self.substitute(part.script, io)
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

    async def expand_one(self, word: Word, io: Streams) -> str:
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

    async def substitute(self, script: Script, io: Streams) -> str:
        captured = bytearray()

        async def capture(data: bytes) -> None:
            await trio.lowlevel.checkpoint()
            captured.extend(data)

        sub = self.child()
        try:
            self.status = await sub.run_script(script, io.replace(write_stdout=capture))
        except ExitShell as exc:
            self.status = exc.status
        return captured.decode("utf-8", "replace").rstrip("\n")

    async def run_simple(self, command: Simple, io: Streams) -> int:
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
                any(isinstance(p, Subst) for p in w.parts) for _, w in command.assignments
            ) else 0
        builtin = _SHELL_BUILTINS.get(argv[0])
        if builtin is not None:
            for name, value in values:
                self.vars[name] = value
            return await builtin(self, argv, io)
        env = self.environment()
        env.update(values)
        if lookup(argv[0]) is None:
            await self.error(io, f"{argv[0]}: not found")
            return 127
        return await run_command(argv, io, env)

    async def redirect(self, redirects: Sequence[Redirect], io: Streams) -> Streams:
        fds: dict[int, Writer | Stdin] = {0: io.stdin, 1: io.write_stdout, 2: io.write_stderr}
        for redirect in redirects:
            target = await self.expand_one(redirect.target, io)
            if redirect.op in (">&", "<&"):
                if target == "-":
                    fds[redirect.fd] = Stdin(read_nothing) if redirect.fd == 0 else discard
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
                fds[redirect.fd] = Stdin(file_reader(chunks))
            elif target == "/dev/null":
                fds[redirect.fd] = discard
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
                fds[redirect.fd] = file_writer(writer)
        stdin, out, err = fds[0], fds[1], fds[2]
        return io.replace(
            stdin=stdin if isinstance(stdin, Stdin) else Stdin(read_nothing),
            write_stdout=out if not isinstance(out, Stdin) else discard,
            write_stderr=err if not isinstance(err, Stdin) else discard,
        )

    async def interact(self, io: CommandIO) -> int:
        """The shell without -c: read commands from stdin, prompting when on a terminal.

        On a terminal, ^C is the shell's to handle (busybox ash, interactive): it ends the
        command in the foreground, whose status is then 130 (128 + SIGINT), or drops the line
        being typed; either way a new prompt follows and the shell goes on. ^D on an empty line
        ends it.
        """
        streams = streams_of(io)
        interrupts = streams.interrupts if streams.tty else None
        prompt = (self.vars.get("PS1") or "/ # ").encode()
        while True:
            if streams.tty:
                await streams.write_stderr(prompt)
            with _foreground(interrupts) as reading:
                source = ""
                script: Script | None = None
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
                    except ExitShell as exc:
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
            raise BrokenPipe from None

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


Builtin = Callable[[Shell, list[str], Streams], Awaitable[int]]


async def _builtin_exit(shell: Shell, argv: list[str], io: Streams) -> int:
    await trio.lowlevel.checkpoint()
    if len(argv) < 2:
        raise ExitShell(shell.status)
    try:
        status = int(argv[1]) & 0xFF
    except ValueError:
        await shell.error(io, f"exit: Illegal number: {argv[1]}")
        raise ExitShell(2) from None
    raise ExitShell(status)


async def _builtin_export(shell: Shell, argv: list[str], io: Streams) -> int:
    await trio.lowlevel.checkpoint()
    for arg in argv[1:]:
        if arg == "-p":
            continue
        name, eq, value = arg.partition("=")
        if not NAME.fullmatch(name):
            await shell.error(io, f"export: bad variable name: {name}")
            return 2
        if eq:
            shell.vars[name] = value
        shell.exported.add(name)
    return 0


async def _builtin_unset(shell: Shell, argv: list[str], io: Streams) -> int:
    await trio.lowlevel.checkpoint()
    for name in argv[1:]:
        if name in ("-v", "-f"):
            continue
        shell.vars.pop(name, None)
        shell.exported.discard(name)
    return 0


async def _builtin_set(shell: Shell, argv: list[str], io: Streams) -> int:
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


async def _builtin_cd(shell: Shell, argv: list[str], io: Streams) -> int:
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


async def _builtin_read(shell: Shell, argv: list[str], io: Streams) -> int:
    names = [a for a in argv[1:] if not a.startswith("-")] or ["REPLY"]
    line, complete = await io.stdin.read_line()
    text = line.decode("utf-8", "replace")
    values = text.split(None, len(names) - 1) if len(names) > 1 else [text.strip()]
    for i, name in enumerate(names):
        shell.vars[name] = values[i] if i < len(values) else ""
    return 0 if complete else 1


async def _builtin_wait(shell: Shell, argv: list[str], io: Streams) -> int:
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
