"""The signal loop of both daemons.

- The first SIGTERM or SIGINT starts the graceful drain: ``main`` is told through its ``drain``
  event, finishes what is in flight (within its own bound) and returns.
- A second one stops at once: ``main`` is cancelled.
- SIGHUP reads the log settings again (``log_settings``: the daemon's ``log_level`` and
  ``log_format`` from its file, environment and flags) in a worker thread and applies them, and calls
  ``on_hangup`` (kasd reloads its authorization configuration); without either it is logged and
  ignored (never Python's default, which ends the process without a drain).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Awaitable, Callable
from functools import partial

import trio

from daemonkit.logs import RELOAD_TIME_LIMIT, reload_log_settings

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


async def run_until_signalled(
    main: Callable[[trio.Event], Awaitable[None]],
    *,
    log: logging.Logger,
    on_hangup: Callable[[], object] | None = None,
    log_settings: Callable[[], tuple[str, str]] | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``main(drain)`` until it returns, handling the signals as the module says; ``log`` is
    the daemon's logger. ``started()`` once the signals are being received."""
    drain = trio.Event()
    with trio.open_signal_receiver(*STOP_SIGNALS, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:
            main_done = trio.CancelScope()

            async def run_main() -> None:
                try:
                    await main(drain)
                finally:
                    main_done.cancel()

            nursery.start_soon(run_main)
            # SIGHUPs that arrive while the log settings are being read again make one more reading
            hangups, hung_up = trio.open_memory_channel[None](1)
            if log_settings is not None:
                nursery.start_soon(_reload_logs, log_settings, log, hung_up)
            task_status.started()
            with main_done:
                async for signum in signals:
                    signame = signal.Signals(signum).name
                    if signum == signal.SIGHUP:
                        if on_hangup is not None or log_settings is not None:
                            log.info("signal received signal=%s: reloading", signame)
                            if log_settings is not None:
                                try:
                                    hangups.send_nowait(None)
                                except trio.WouldBlock:
                                    pass
                            if on_hangup is not None:
                                on_hangup()
                        else:
                            log.warning("signal received signal=%s: ignored (nothing to reload; restart to apply "
                                        "configuration)", signame)
                    elif not drain.is_set():
                        log.info("signal received signal=%s: shutting down gracefully", signame)
                        drain.set()
                    else:
                        log.warning("second signal received signal=%s: stopping now", signame)
                        nursery.cancel_scope.cancel()
            nursery.cancel_scope.cancel()  # main has returned: the log settings' reader too


async def _reload_logs(read: Callable[[], tuple[str, str]], log: logging.Logger,
                       hung_up: trio.MemoryReceiveChannel[None]) -> None:
    """For each SIGHUP, ``reload_log_settings`` off the event loop, bounded in time."""
    async for _ in hung_up:
        with trio.move_on_after(RELOAD_TIME_LIMIT + 1.0):
            await trio.to_thread.run_sync(partial(reload_log_settings, read, log), abandon_on_cancel=True)
            continue
        log.warning("log settings not reloaded: reading the configuration took longer than %g s", RELOAD_TIME_LIMIT)
