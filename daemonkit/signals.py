"""The signal loop of both daemons.

- The first SIGTERM or SIGINT starts the graceful drain: ``main`` is told through its ``drain``
  event, finishes what is in flight (within its own bound) and returns.
- A second one stops at once: ``main`` is cancelled.
- SIGHUP calls ``on_hangup`` (kasd reloads its authorization configuration); without one it is
  logged and ignored (never Python's default, which ends the process without a drain).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Awaitable, Callable

import trio

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


async def run_until_signalled(
    main: Callable[[trio.Event], Awaitable[None]],
    *,
    log: logging.Logger,
    on_hangup: Callable[[], object] | None = None,
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
            task_status.started()
            with main_done:
                async for signum in signals:
                    signame = signal.Signals(signum).name
                    if signum == signal.SIGHUP:
                        if on_hangup is not None:
                            log.info("signal received signal=%s: reloading", signame)
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
