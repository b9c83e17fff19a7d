"""daemonkit's signal loop: SIGHUP is logged and ignored, the first SIGTERM/SIGINT starts the drain,
a second one cancels what is left; and a real kasd that outlives a SIGHUP."""

from __future__ import annotations

import logging
import os
import signal
from functools import partial

import pytest
import trio

from daemonkit.signals import run_until_signalled
from tests.daemons import running_daemon

pytestmark = pytest.mark.timeout(20)


class _Lines(logging.Handler):
    """Log messages as they come, and an event for the next one that contains ``awaited``."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []
        self.awaited = ""
        self.arrived = trio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        if self.awaited and self.awaited in record.getMessage():
            self.arrived.set()

    def expect(self, text: str) -> trio.Event:
        self.awaited, self.arrived = text, trio.Event()
        return self.arrived


@pytest.fixture
def lines() -> logging.Logger:
    log = logging.getLogger("tests.daemonkit.signals")
    log.setLevel(logging.INFO)
    log.propagate = False
    log.handlers[:] = [_Lines()]
    return log


def _recorder(log: logging.Logger) -> _Lines:
    handler = log.handlers[0]
    assert isinstance(handler, _Lines)
    return handler


async def test_sighup_is_ignored_then_sigterm_drains(lines: logging.Logger) -> None:
    recorder = _recorder(lines)
    drained = trio.Event()

    async def main(drain: trio.Event) -> None:
        await drain.wait()
        drained.set()  # a drain that finishes at once: main returns

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(run_until_signalled, main, log=lines))
            logged = recorder.expect("nothing to reload")
            os.kill(os.getpid(), signal.SIGHUP)
            await logged.wait()
            assert not drained.is_set()
            os.kill(os.getpid(), signal.SIGTERM)
    assert drained.is_set()
    assert recorder.messages == [
        "signal received signal=SIGHUP: ignored (nothing to reload; restart to apply configuration)",
        "signal received signal=SIGTERM: shutting down gracefully",
    ]


async def test_sighup_calls_the_reload_hook_and_the_daemon_goes_on(lines: logging.Logger) -> None:
    recorder = _recorder(lines)
    reloads: list[int] = []
    reloaded = trio.Event()

    def on_hangup() -> None:
        reloads.append(1)
        reloaded.set()

    async def main(drain: trio.Event) -> None:
        await drain.wait()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(run_until_signalled, main, log=lines, on_hangup=on_hangup))
            os.kill(os.getpid(), signal.SIGHUP)
            await reloaded.wait()
            os.kill(os.getpid(), signal.SIGTERM)
    assert reloads == [1]
    assert recorder.messages == [
        "signal received signal=SIGHUP: reloading",
        "signal received signal=SIGTERM: shutting down gracefully",
    ]


async def test_a_second_signal_cancels_the_drain(lines: logging.Logger) -> None:
    recorder = _recorder(lines)
    draining = trio.Event()
    cancelled = False

    async def main(drain: trio.Event) -> None:
        nonlocal cancelled
        await drain.wait()
        draining.set()
        try:
            await trio.sleep_forever()  # a drain that would never finish on its own
        except trio.Cancelled:
            cancelled = True
            raise

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(run_until_signalled, main, log=lines))
            os.kill(os.getpid(), signal.SIGINT)
            await draining.wait()
            os.kill(os.getpid(), signal.SIGTERM)
    assert cancelled
    assert recorder.messages[-1] == "second signal received signal=SIGTERM: stopping now"


async def test_kasd_reloads_on_sighup_and_drains_on_sigterm() -> None:
    args = ["--agent-address", "127.0.0.1:0", "--observability-address", "127.0.0.1:0",
            "--kubernetes-api-address", "127.0.0.1:0"]
    with trio.fail_after(15):
        async with running_daemon("kasd", args) as log:  # then SIGTERM, and exit 0
            await log.until("kasd listening")
            log.process.send_signal(signal.SIGHUP)
            await log.until("authorization reloaded (SIGHUP)")
            await log.until("log level now info log_format=logfmt")  # its log settings read again too
    assert "kasd stopped" in log.text
