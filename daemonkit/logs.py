"""The daemons' log lines: ``time=… level=… logger=… message`` on stderr, cheap enough per request.

kasd writes an access line per proxied request and agentd one per upstream exchange, so record
creation is on the hot path. Following the logging HOWTO's "Optimization" table, records skip what
our format never shows (caller frame, thread, process), and the UTC timestamp is formatted once a
second instead of on every line.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from types import TracebackType
from typing import Any, TextIO

import trio

from daemonkit import yamldoc
from daemonkit.settings import SettingsError

FORMAT = "time=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"


def escape_unprintable(text: str) -> str:
    """``text`` with every character ``str.isprintable`` refuses (control characters — newline,
    carriage return, ESC of a terminal sequence —, format characters such as the bidi overrides, line
    and paragraph separators, unassigned code points) written as its escape (``\\n``, ``\\x1b``,
    ``\\u202e``); ``text`` itself when there is none (the common case costs one scan in C)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


#: the id of the request the running task serves and the task that serves it (``request_context``)
_REQUEST: ContextVar[tuple[str, object] | None] = ContextVar("request", default=None)


def _current_task() -> object:
    try:
        return trio.lowlevel.current_task()
    except RuntimeError:  # not in a trio task (a worker thread, plain code)
        return None


@contextmanager
def request_context(request_id: str) -> Iterator[None]:
    """Within it, every line the task logs (and the tasks it starts in its own nurseries) carries
    ``request_id=<id>`` (a field of its own in JSON), unless the line names its ``request_id``
    itself. ``request_id`` must be safe to log as it is (``tunnelhttp.requestid.is_safe``); ""
    adds nothing."""
    token = _REQUEST.set((request_id, _current_task()) if request_id else None)
    try:
        yield
    finally:
        _REQUEST.reset(token)


def _request_id() -> str:
    """The id of the request the running task serves, or "". A task inherits its context from the
    task that started it, also one started in a service's nursery (a peer session dialled for a
    request) that outlives the request: only the request's task and the tasks below it (in the
    nurseries it opened) are about the request."""
    held = _REQUEST.get()
    if held is None:
        return ""
    request_id, owner = held
    task = _current_task()
    if task is None or owner is None:
        return request_id  # a worker thread run for the request (its context was copied for it)
    while task is not owner:
        nursery = task.parent_nursery  # type: ignore[attr-defined]
        if nursery is None:
            return ""
        task = nursery.parent_task
    return request_id


def current_request_id() -> str:
    """The id of the request the running task serves (``request_context``), or "": what a request
    kasd makes on its behalf (to an agent) carries on."""
    return _request_id()


def _request_pair(message: str) -> str:
    """`` request_id=<id>`` to end ``message`` with, or "" (no request, or the message has one)."""
    if "request_id=" in message or not (request_id := _request_id()):
        return ""
    return f" request_id={request_id}"


class _Formatter(logging.Formatter):
    """One record, one line: the message (with whatever a peer, a client or a file put into its
    arguments: a pod name, an event's detail, a path) is escaped by ``escape_unprintable``, so no value
    can start a forged line or send a terminal sequence to whoever reads the log; a traceback
    (``exc_info``), kasd's own text, keeps its lines."""

    def __init__(self) -> None:
        super().__init__(FORMAT)
        self._second = -1
        self._stamp = ""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape_unprintable(record.message) + _request_pair(record.message)
        return super().formatMessage(record)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        second = int(record.created)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second))
        return self._stamp


#: the values of the ``log_format`` setting of both daemons
LOG_FORMATS = ("logfmt", "json")

#: the key=value pairs of a message written in logfmt: a key, then a bare value or a JSON string
_KEY = r"[A-Za-z_][A-Za-z0-9_.-]*"
_FIRST_KEY = re.compile(rf"(?:^| )(?={_KEY}=)")
_VALUE = r'"(?:[^"\\\n]|\\.)*"|[^ "]*'
_PAIR = re.compile(rf"({_KEY})=({_VALUE})")
#: the pairs that end a message: single spaces between them, none after (one way to read it: linear)
_PAIRS = re.compile(rf"(?:{_KEY}=(?:{_VALUE}) )*{_KEY}=(?:{_VALUE})")
#: the fields every JSON line has; a message's key=value never replaces one of them
_RESERVED = frozenset({"time", "level", "logger", "msg", "exc_info"})


def message_fields(message: str) -> tuple[str, dict[str, str]]:
    """``message`` split into its text and the logfmt ``key=value`` pairs that end it
    (``"request served status=200 path=\"/a b\""`` → ``("request served", {"status": "200", "path": "/a b"})``).
    A message that does not end in well-formed pairs (a key twice, a reserved key, a value that is
    neither bare nor a JSON string, text after the pairs) is all text: nothing is guessed."""
    start = _FIRST_KEY.search(message)
    if start is None:
        return message, {}
    if _PAIRS.fullmatch(message, start.end()) is None:
        return message, {}
    fields: dict[str, str] = {}
    for key, value in _PAIR.findall(message, start.end()):
        if key in fields or key in _RESERVED:
            return message, {}
        if value.startswith('"'):
            try:
                value = json.loads(value)
            except ValueError:
                return message, {}
        fields[key] = value
    return message[:start.start()], fields


def _json_escape_unprintable(line: str) -> str:
    """A JSON text with every character ``str.isprintable`` refuses written as its ``\\uXXXX``
    escape (json.dumps already escapes the control characters; this covers the bidi overrides,
    line separators and the rest), so that a line is still one line of plain text."""
    if line.isprintable():
        return line
    out = []
    for c in line:
        if c.isprintable():
            out.append(c)
        elif ord(c) > 0xFFFF:
            high, low = divmod(ord(c) - 0x10000, 0x400)
            out.append(f"\\u{0xD800 + high:04x}\\u{0xDC00 + low:04x}")
        else:
            out.append(f"\\u{ord(c):04x}")
    return "".join(out)


class _JsonFormatter(_Formatter):
    """One record, one JSON object on one line: ``time``, ``level``, ``logger``, ``msg`` (the
    message's text) and each logfmt ``key=value`` of the message as a field of its own (all strings);
    a traceback is the ``exc_info`` field. Every value is escaped by json.dumps, and every character
    that is not printable is ``\\uXXXX``, so no value can start a forged line."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        text, fields = message_fields(message)
        line: dict[str, str] = {"time": self.formatTime(record), "level": record.levelname,
                                "logger": record.name, "msg": text}
        line.update(fields)
        if "request_id" not in line and (request_id := _request_id()):
            line["request_id"] = request_id
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exc_info"] = record.exc_text
        return _json_escape_unprintable(_encode(line))


#: json.dumps(…, ensure_ascii=False) without building an encoder per line
_encode = json.JSONEncoder(ensure_ascii=False, check_circular=False).encode

_handler: logging.StreamHandler[TextIO] | None = None


def configure_logging(level: str, stream: TextIO | None = None, log_format: str = "logfmt") -> None:
    """Root logger → ``stream`` (stderr) at ``level`` (a name such as ``info``), in ``log_format``
    (``logfmt`` or ``json``), our format only."""
    global _handler
    logging._srcfile = None  # no caller frame lookup per record (HOWTO)
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    _handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    _handler.setFormatter(_JsonFormatter() if log_format == "json" else _Formatter())
    root = logging.getLogger()
    root.handlers[:] = [_handler]
    _set_level(level)


def _set_level(level: str) -> None:
    root = logging.getLogger()
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    # hpack logs decoded headers (Authorization included) at DEBUG: never let tokens reach the log.
    for noisy in ("hpack", "h2"):
        logging.getLogger(noisy).setLevel(max(logging.INFO, root.level))


def current_log_settings() -> tuple[str, str]:
    """The level and format the daemon logs with now (``("info", "logfmt")``)."""
    level = logging.getLevelName(logging.getLogger().level).lower()
    json_now = _handler is not None and isinstance(_handler.formatter, _JsonFormatter)
    return level, "json" if json_now else "logfmt"


#: bound on reading the configuration again for its log settings (SIGHUP)
RELOAD_TIME_LIMIT = 5.0


def reload_log_settings(read: Callable[[], tuple[str, str]], log: logging.Logger) -> bool:
    """Apply the level and format ``read()`` gives (the daemon's settings read again: file <
    environment < flags) and say so in one line, ``log level now debug log_format=logfmt``; when
    ``read`` fails (a bad value, an unreadable file), keep both and say why. Blocking (run it in a
    worker thread)."""
    old_level, old_format = current_log_settings()
    try:
        with yamldoc.time_limit(RELOAD_TIME_LIMIT):
            level, log_format = read()
    except Exception as exc:
        # a settings error names the key and the problem, never a secret; anything else only by its type
        why = str(exc) if isinstance(exc, SettingsError) else type(exc).__qualname__
        log.warning("log settings not reloaded: %s; log level stays %s log_format=%s", why, old_level, old_format)
        return False
    if _handler is not None and log_format != old_format:
        _handler.setFormatter(_JsonFormatter() if log_format == "json" else _Formatter())
    # the line is written at the more verbose of the two levels, so that it shows
    if logging.getLevelName(level.upper()) <= logging.getLevelName(old_level.upper()):
        _set_level(level)
        log.info("log level now %s log_format=%s", level, log_format)
    else:
        log.info("log level now %s log_format=%s", level, log_format)
        _set_level(level)
    return True


class BurstLimitedLog:
    """A log line that may repeat in a burst (one per refused connection, per reset stream, per
    retried OPEN) written at most once per ``interval`` seconds for each ``key``; the lines held back
    are counted and the next line written for that key says how many (``suppressed=N``).

    Nothing runs in the background: a count still held when the burst ends is written by the next
    line of its key, or by ``flush()`` (call it where a burst is known to be over, e.g. when a
    connection closes). At most ``max_keys`` keys are remembered (the oldest is flushed first), so a
    stranger choosing keys (source addresses) cannot make it grow without bound.

        refusals = BurstLimitedLog(log, interval=10)
        refusals.warning(peer_host, "connection refused peer=%s reason=%s", peer, reason)
    """

    def __init__(
        self,
        logger: logging.Logger,
        *,
        interval: float = 10.0,
        max_keys: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.interval = interval
        self.max_keys = max_keys
        self.clock = clock
        #: key -> [when the last line was written, lines held back since, level, message, args]
        self._held: dict[Hashable, list[Any]] = {}

    def log(self, level: int, key: Hashable, message: str, *args: object) -> bool:
        """Write the line now (True) or count it (False)."""
        if not self.logger.isEnabledFor(level):
            return False
        now = self.clock()
        held = self._held.get(key)
        if held is not None and now - held[0] < self.interval:
            held[1] += 1
            held[2:] = [level, message, args]
            return False
        suppressed = held[1] if held is not None else 0
        if held is None and len(self._held) >= self.max_keys:
            self._flush_key(next(iter(self._held)))
        self._held.pop(key, None)
        self._held[key] = [now, 0, level, message, args]
        if suppressed:
            self.logger.log(level, message + " suppressed=%d", *args, suppressed)
        else:
            self.logger.log(level, message, *args)
        return True

    def info(self, key: Hashable, message: str, *args: object) -> bool:
        return self.log(logging.INFO, key, message, *args)

    def warning(self, key: Hashable, message: str, *args: object) -> bool:
        return self.log(logging.WARNING, key, message, *args)

    def flush(self, key: Hashable | None = None) -> None:
        """Write the count of lines held back (for ``key``, or every key) and forget them."""
        for k in [key] if key is not None else list(self._held):
            if k in self._held:
                self._flush_key(k)

    def _flush_key(self, key: Hashable) -> None:
        _, suppressed, level, message, args = self._held.pop(key)
        if suppressed:
            self.logger.log(level, message + " suppressed=%d", *args, suppressed)


def _where(tb: TracebackType | None) -> list[str]:
    """``file.py:123 function`` for each frame of ``tb``, outermost first."""
    frames = []
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append(f"{code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno} {code.co_name}")
        tb = tb.tb_next
    return frames


class UnexpectedErrors:
    """Exceptions that are a bug, not the peer's fault, caught where one request or connection is
    served so that nothing else ends with it. Each is one line at ERROR, rate-limited like
    ``BurstLimitedLog`` per kind (the exception's type and the place it was raised: a peer that
    found a way to trigger one can repeat it, but cannot invent new kinds). The line names the type
    and the frames it went through (``file.py:line function``, innermost last), never the
    exception's message or arguments, which may quote what the peer sent (a token, a header).
    ``on_suppressed`` is called for each line held back (a metric), ``on_error`` for every one.

        unexpected = UnexpectedErrors(log, interval=60, on_suppressed=metric.inc)
        unexpected.report(exc, "request failed request_id=%s", request_id)
    """

    #: frames a line shows, the innermost ones (where the bug is)
    MAX_FRAMES = 12

    def __init__(
        self,
        logger: logging.Logger,
        *,
        interval: float = 60.0,
        on_error: Callable[[], object] | None = None,
        on_suppressed: Callable[[], object] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lines = BurstLimitedLog(logger, interval=interval, max_keys=256, clock=clock)
        self.on_error = on_error
        self.on_suppressed = on_suppressed

    def report(self, exc: BaseException, message: str, *args: object) -> bool:
        """Write ``message`` with the kind of ``exc`` and where it came from (True), or count it (False)."""
        frames = _where(exc.__traceback__)
        kind = type(exc).__qualname__
        if isinstance(exc, BaseExceptionGroup):
            inner = exc.exceptions[0] if exc.exceptions else exc
            kind = f"{kind}[{type(inner).__qualname__}]"
            frames += _where(inner.__traceback__)
        shown = frames[-self.MAX_FRAMES:]
        if self.on_error is not None:
            self.on_error()
        written = self._lines.log(
            logging.ERROR, (kind, shown[-1] if shown else ""),
            message + " error=%s trace=%s", *args, kind, "\"" + " < ".join(reversed(shown)) + "\"",
        )
        if not written and self.on_suppressed is not None:
            self.on_suppressed()
        return written


#: what a token looks like in text a client chose (a path): a JWT (kasd's personal and CI job tokens)
#: or a GitLab token by its prefix (glpat-, glcbt-, glagent-, …)
_TOKEN_TEXT = re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"
                         r"|gl(?:pat|dt|cbt|rt|ptt|agent|ft|imt|soat|oas|ffct)-[A-Za-z0-9_.-]{16,}")


def redact_tokens(text: str) -> str:
    """``text`` (a request's path, for a log line) with anything token-shaped replaced by
    ``[redacted]``: a client that puts its token in a path must not put it in kasd's log."""
    return _TOKEN_TEXT.sub("[redacted]", text)


_NEEDS_QUOTES = re.compile(r'[ "=\\]')


def logfmt(value: str) -> str:
    """A value as logfmt parsers read it: bare if it can be, else double-quoted (``"demo CI job"``)."""
    if value and _NEEDS_QUOTES.search(value) is None and value.isprintable():
        return value
    return json.dumps(value, ensure_ascii=False)
