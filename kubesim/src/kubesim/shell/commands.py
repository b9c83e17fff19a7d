"""The table of what a container can run, and `run_command`, which runs one of them.

The commands register themselves (`@command("name")`) in `builtins` and `files`, which the
package imports; a name under a bin directory (`/bin/sh`) is the same command.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence

from kubesim.fs import FileSystem, container_tree
from kubesim.shell.stdio import (
    BrokenPipe,
    CommandIO,
    Stdin,
    Streams,
    WriteError,
    command_name,
)


def streams_of(io: CommandIO, fs: FileSystem | None = None, cwd: str = "/") -> Streams:
    """What a command gets of `io` (`io` itself when it is already `Streams`)."""
    if isinstance(io, Streams):
        return io
    return Streams(
        stdin=Stdin(io.read_stdin),
        write_stdout=io.write_stdout,
        write_stderr=io.write_stderr,
        tty=io.tty,
        fs=fs if fs is not None else container_tree(FileSystem(), commands=tuple(_COMMANDS)),
        cwd=cwd,
        # A Terminal offers its interrupts; other streams have none.
        interrupts=getattr(io, "interrupts", None),
    )


Command = Callable[[Sequence[str], Streams, Mapping[str, str]], Awaitable[int]]
_COMMANDS: dict[str, Command] = {}
_BIN_DIRS = ("/bin", "/usr/bin", "/sbin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin")


def command(*names: str) -> Callable[[Command], Command]:
    def register(fn: Command) -> Command:
        for name in names:
            _COMMANDS[name] = fn
        return fn

    return register


def lookup(name: str) -> Command | None:
    if "/" in name:
        directory, _, base = name.rpartition("/")
        if directory not in _BIN_DIRS:
            return None
        name = base
    return _COMMANDS.get(name)


def is_command(name: str) -> bool:
    """Whether `name` (bare or under a bin directory) is something this container can run."""
    return lookup(name) is not None


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
    fn = lookup(argv[0])
    if fn is None:
        await io.write_stderr(f"sh: {argv[0]}: not found\n".encode())
        return 127
    if fs is None and not isinstance(io, Streams):
        fs = container_tree(FileSystem(), hostname=env.get("HOSTNAME", "localhost"),
                            commands=tuple(_COMMANDS))
    streams = streams_of(io, fs, cwd)
    try:
        return await fn(argv, streams, env)
    except BrokenPipe:
        return 128 + 13  # SIGPIPE
    except WriteError as exc:
        await streams.write_stderr(f"{command_name(argv)}: write error: {exc.error.strerror}\n".encode())
        return 1
