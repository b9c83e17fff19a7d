"""kasd and agentd as real processes in a test: stderr read as far as the test needs, SIGTERM at the
end (a clean exit is part of what the test checks), and a kill if the test fails first."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import trio


class StderrLog:
    """A process's stderr, read as far as needed."""

    def __init__(self, process: trio.Process) -> None:
        assert process.stderr is not None
        self.process = process
        self.stream = process.stderr
        self.text = ""

    async def until(self, needle: str) -> None:
        while needle not in self.text:
            chunk = await self.stream.receive_some(65536)
            assert chunk, f"stderr ended before {needle!r}:\n{self.text}"
            self.text += chunk.decode()

    async def rest(self) -> None:
        while chunk := await self.stream.receive_some(65536):
            self.text += chunk.decode()


@asynccontextmanager
async def running_daemon(module: str, args: Sequence[str], *,
                         env: dict[str, str] | None = None) -> AsyncIterator[StderrLog]:
    """``python -m module args``; after the block, SIGTERM, the rest of stderr, and exit code 0.
    The caller bounds it all (``with trio.fail_after(…)``); a process left running is killed."""
    process = await trio.lowlevel.open_process([sys.executable, "-m", module, *args], stderr=subprocess.PIPE,
                                               env={"PATH": "/usr/bin:/bin", **(env or {})})
    log = StderrLog(process)
    try:
        yield log
        process.send_signal(signal.SIGTERM)
        await log.rest()
        assert await process.wait() == 0, log.text
    finally:
        if process.returncode is None:
            process.kill()
            with trio.move_on_after(5, shield=True):
                await process.wait()
