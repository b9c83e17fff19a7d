"""A container's main process: its `command`/`args` run in the shell emulator (`shell`).

`main_argv` decides what a container runs (Kubernetes semantics: `command` replaces the image's
entrypoint, `args` its cmd); `MainProcess` is one run of it, with the console its output goes to
(stdout and stderr, line by line, become the container's log) and the stdin that `attach` feeds.
The kubelet (`kubelet`) starts processes in the controllers' nursery, and turns an exit into
`state.terminated`, a restart or a `CrashLoopBackOff` by the pod's `restartPolicy`.

What kubesim assumes of images (it has none): no ENTRYPOINT, or one that runs its arguments (as
nginx's `/docker-entrypoint.sh` does), so `args` alone are the command. A container with neither
`command` nor `args`, or whose program is not a built-in of `shell` (a real server binary), runs
kubesim's idle main process: it runs until the pod is deleted and echoes what `attach` writes to
it, like a long-running server (nginx) — also for busybox, whose real default `sh` would exit at
once without stdin. In a Job's pod such a container exits 0 at once (1 with `kubesim.io/fail`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

import attrs
import trio

from kubesim.console import ContainerConsole
from kubesim.fs import FileSystem
from kubesim.shell import is_command, run_command
from kubesim.timefmt import now

log = logging.getLogger(__name__)


def container_env(pod: dict[str, Any], container: str) -> dict[str, str]:
    """What `env` prints in the container: its literal `env` values and what the kubelet adds."""
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "HOSTNAME": pod["metadata"]["name"], "KUBERNETES_SERVICE_HOST": "10.96.0.1",
           "KUBERNETES_SERVICE_PORT": "443", "KUBERNETES_PORT": "tcp://10.96.0.1:443", "HOME": "/root"}
    for spec in (pod.get("spec") or {}).get("containers") or []:
        if spec.get("name") == container:
            for var in spec.get("env") or []:
                if "value" in var:
                    env[var["name"]] = str(var["value"])
    return env


def main_argv(container: dict[str, Any], *, job_pod: bool, fail: bool) -> list[str] | None:
    """What the container's main process runs; None for kubesim's idle main process."""
    command = [str(part) for part in container.get("command") or []]
    args = [str(part) for part in container.get("args") or []]
    argv = [*command, *args] if command else args
    if job_pod and fail:
        return ["sh", "-c", "exit 1"]
    if argv and is_command(argv[0]):
        return argv
    if job_pod:
        return ["true"]
    return None


class ProcessStdin:
    """The main process's stdin: what attach sessions write, EOF once closed.

    A container without `stdin: true` has its stdin closed from the start (reads see EOF at once,
    as with /dev/null); with `stdinOnce: true` the first attach session's end closes it.
    """

    def __init__(self, *, open_: bool, once: bool) -> None:
        self._buffer = bytearray()
        self._closed = not open_
        self._once = once
        self._changed = trio.Event()

    def write(self, data: bytes) -> None:
        if self._closed or not data:
            return
        self._buffer += data
        self._changed.set()

    def end(self) -> None:
        """An attached client closed its stdin: EOF for the process if `stdinOnce`."""
        if self._once:
            self._closed = True
            self._changed.set()

    async def read(self) -> bytes:
        while not self._buffer and not self._closed:
            await self._changed.wait()
            self._changed = trio.Event()
        await trio.lowlevel.checkpoint()
        data = bytes(self._buffer)
        self._buffer.clear()
        return data


@attrs.define(eq=False)
class MainProcess:
    """One run of a container's main process (a restart is a new one)."""

    argv: list[str]
    console: ContainerConsole
    stdin: ProcessStdin
    #: The run's filesystem, shared with exec sessions into the container.
    fs: FileSystem = attrs.Factory(FileSystem)
    started: datetime = attrs.Factory(now)
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    exit_code: int | None = None
    finished: datetime | None = None
    #: Set by the kubelet once it has seen the exit: trio time of the restart, or None (no restart).
    restart_at: float | None = None
    seen_exit: bool = False

    async def run(self, env: dict[str, str], on_exit: Callable[[], None]) -> None:
        io = _ConsoleIO(self)
        code = 1
        with self.scope:
            try:
                code = await run_command(self.argv, io, env, fs=self.fs)
            except Exception:  # a bug in a command must still end the container
                log.exception("container command %r failed", self.argv)
                code = 128
        if self.scope.cancelled_caught:
            return  # the pod went away: nobody is left to tell
        io.flush()
        self.exit_code = code
        self.finished = now()
        self.console.close()
        on_exit()


class _ConsoleIO:
    """A main process's streams: stdin from attach, stdout and stderr into the log by lines."""

    tty = False

    def __init__(self, process: MainProcess) -> None:
        self._process = process
        self._partial = {1: b"", 2: b""}

    async def read_stdin(self) -> bytes:
        return await self._process.stdin.read()

    async def write_stdout(self, data: bytes) -> None:
        self._write(1, data)
        await trio.lowlevel.checkpoint()

    async def write_stderr(self, data: bytes) -> None:
        self._write(2, data)
        await trio.lowlevel.checkpoint()

    def _write(self, stream: int, data: bytes) -> None:
        *lines, self._partial[stream] = (self._partial[stream] + data).split(b"\n")
        for line in lines:
            self._process.console.log(line.decode("utf-8", "replace"))

    def flush(self) -> None:
        for stream, rest in self._partial.items():
            if rest:
                self._partial[stream] = b""
                self._process.console.log(rest.decode("utf-8", "replace"))
