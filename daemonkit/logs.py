"""The daemons' log lines: ``time=… level=… logger=… message`` on stderr, cheap enough per request.

kasd writes an access line per proxied request and agentd one per upstream exchange, so record
creation is on the hot path. Following the logging HOWTO's "Optimization" table, records skip what
our format never shows (caller frame, thread, process), and the UTC timestamp is formatted once a
second instead of on every line.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

FORMAT = "time=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"


class _Formatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(FORMAT)
        self._second = -1
        self._stamp = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        second = int(record.created)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second))
        return self._stamp


def configure_logging(level: str, stream: TextIO | None = None) -> None:
    """Root logger → ``stream`` (stderr) at ``level`` (a name such as ``info``), our format only."""
    logging._srcfile = None  # no caller frame lookup per record (HOWTO)
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(_Formatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    # hpack logs decoded headers (Authorization included) at DEBUG: never let tokens reach the log.
    for noisy in ("hpack", "h2"):
        logging.getLogger(noisy).setLevel(max(logging.INFO, root.level))
