"""``python -m <module> args…`` as a real process, without paying Python's start and the daemons'
imports each time.

A command-line test wants what a user gets: a process of its own (its own environment, stdin, exit
status, signal handlers, logging), its stdout and stderr. ``subprocess.run([sys.executable, "-m",
"kasd", …])`` gives that but spends about 1.3 s of CPU importing kasd (hypercorn, h2,
cryptography, …) on every call, which made the CLI test files the slowest of the suite
(docs/testing.md). Here a small fork server, one per test process, imports the daemons'
``__main__`` modules once; each call is a fresh fork of it that takes the working directory,
environment, stdin and argv given, runs the module as ``python -m`` does (``runpy``, ``__name__ ==
"__main__"``) and exits with its status, which the server reports. What differs from a new
interpreter: the modules were imported before the environment was set, so a module that reads the
environment at import time sees the test process's; a test of that, or of signals to a serving
daemon, uses a real ``subprocess``.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["run_module"]

PRELOAD = ("agentd.__main__", "kasctl.__main__", "kasd.__main__", "kubesim.__main__")
ROOT = Path(__file__).resolve().parent.parent


def _run_child(request: dict[str, Any]) -> int:
    """In the forked child: become ``python -m module args…`` and return its exit status."""
    import runpy

    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path, mode in ((0, request["stdin"] or os.devnull, os.O_RDONLY), (1, request["out"], os.O_WRONLY),
                           (2, request["err"], os.O_WRONLY)):
        opened = os.open(path, mode)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's stdin until it exits
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115 - line-buffered, as Python's
    sys.argv = [request["module"], *request["args"]]
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:  # what the interpreter does with an uncaught exception
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    return code


def serve() -> None:
    """The fork server: a JSON request a line on stdin, ``{"pid"}`` then ``{"status"}`` on stdout."""
    for module in PRELOAD:
        try:
            __import__(module)
        except Exception:
            pass
        sys.modules.pop(module, None)  # what it imports stays; runpy runs the module itself afresh
    replies = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _run_child(request)
            finally:
                os._exit(code)  # the child never returns to the server's loop
        print(json.dumps({"pid": pid}), file=replies, flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"status": os.waitstatus_to_exitcode(status)}), file=replies, flush=True)


class _Server:
    def __init__(self) -> None:
        code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from tests.forkrun import serve; serve()"
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, bufsize=0)
        self.pending = b""  # replies read from the pipe but not yet taken: select() sees only the pipe
        self.child: int | None = None  # forked and not yet reported (so not reaped: the pid is its)
        self.lock = threading.Lock()
        atexit.register(self.close)

    def _reply(self, timeout: float | None) -> dict[str, Any] | None:
        """The next reply line, or None when none came within ``timeout``."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.pending:
            if timeout is not None and not select.select([fd], [], [], timeout)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError("the fork server of tests/forkrun.py exited")
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def run(self, request: dict[str, Any], timeout: float) -> int | None:
        """The exit status, or None when the process outlived ``timeout`` (it is killed)."""
        assert self.proc.stdin is not None
        with self.lock:
            try:
                self.proc.stdin.write(json.dumps(request).encode() + b"\n")
                started = self._reply(30)
                assert started is not None, "the fork server did not answer"
                self.child = started["pid"]
                finished = self._reply(timeout)
                if finished is None:
                    os.kill(started["pid"], signal.SIGKILL)
                    self._reply(None)
                    self.child = None
                    return None
                self.child = None
                status: int = finished["status"]
                return status
            except BaseException:
                self.close()  # interrupted between a request and its replies: no later call may read them
                raise

    def close(self) -> None:
        if self.child is not None and self.proc.poll() is None:
            try:
                if self._reply(0) is None:  # no status yet: still running, and still ours
                    os.kill(self.child, signal.SIGKILL)
            except (OSError, RuntimeError, ValueError):
                pass
            self.child = None
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


_server: _Server | None = None


def run_module(module: str, *args: str, input: str | None = None, env: Mapping[str, str] | None = None,
               cwd: str | Path | None = None, timeout: float = 15) -> subprocess.CompletedProcess[str]:
    """What ``subprocess.run([sys.executable, "-m", module, *args], input=input, env=env, cwd=cwd,
    capture_output=True, text=True, timeout=timeout)`` returns; stdin is empty without ``input``."""
    global _server
    if _server is None or _server.proc.poll() is not None:
        _server = _Server()
    with tempfile.TemporaryDirectory(prefix="forkrun-") as scratch:
        files = Path(scratch)
        stdin = None
        if input is not None:
            (files / "stdin").write_text(input)
            stdin = str(files / "stdin")
        out, err = files / "stdout", files / "stderr"
        out.touch()
        err.touch()
        status = _server.run({"module": module, "args": list(args), "env": dict(os.environ if env is None else env),
                              "stdin": stdin, "out": str(out), "err": str(err), "cwd": str(cwd or os.getcwd())}, timeout)
        argv = [sys.executable, "-m", module, *args]
        if status is None:
            raise subprocess.TimeoutExpired(argv, timeout, out.read_text(), err.read_text())
        return subprocess.CompletedProcess(argv, status, out.read_text(), err.read_text())
