"""HTTP/1.1 message framing for the daemons' outer hops: llhttp (through httptools) parses, this frames.

Sans-I/O, in the manner of h11: bytes go in with ``feed``/``feed_eof``, events come out of
``next_event``, and the bytes to send are built by plain functions and a ``BodyWriter``. It exists
because h11's pure-Python state machine was the largest single cost of a proxied request in both
daemons (kasd's proxy port is an HTTP/1.1 server, agentd's upstream pool an HTTP/1.1 client); llhttp
is Node.js's parser, in C, and does the strict parsing (request smuggling, chunked framing, header
syntax) that h11 did.

Events from ``next_event``:

- a ``Request`` (``RequestParser``) or ``Response`` (``ResponseParser``) head;
- body data, as non-empty ``bytes``;
- ``END``: the message is complete. After an upgrade (a request asking for one, a ``101``) the
  parser stops: ``trailing`` holds the bytes that followed, which belong to the new protocol;
- ``NEED_DATA``: feed more; ``CLOSED``: the peer closed between messages.

A malformed message raises ``RemoteProtocolError`` (of the project's one family, ``wire.errors``;
``status`` is the answer a server would give) from ``next_event`` (never from ``feed``, so a task
that only reads can hand bytes over and let the task that parses report the error), after any
events that came before it.
"""

from __future__ import annotations

import re
from collections import deque
from http import HTTPStatus

import attrs
import httptools

from wire.errors import ProtocolError, RemoteProtocolError
from wire.ids import InvalidNumber, parse_decimal

__all__ = [
    "CLOSED",
    "END",
    "NEED_DATA",
    "BodyWriter",
    "FramingError",
    "ProtocolError",
    "RemoteProtocolError",
    "Request",
    "RequestParser",
    "Response",
    "ResponseParser",
    "encode_request_head",
    "encode_response_head",
]


class _Sentinel:
    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


NEED_DATA = _Sentinel("NEED_DATA")
END = _Sentinel("END")
CLOSED = _Sentinel("CLOSED")

Headers = list[tuple[str, str]]


def _malformed(message: str, status: int = 400) -> RemoteProtocolError:
    """The peer sent something that is not HTTP/1.1; ``status`` is the answer a server would give."""
    return RemoteProtocolError(message, status=status)


class FramingError(Exception):
    """Our own message is malformed: a body longer or shorter than its Content-Length, a bad header."""


@attrs.frozen(slots=True)
class Request:
    method: str
    target: str
    #: "1.1" or "1.0"
    http_version: str
    #: names lower-cased, values as sent
    headers: Headers
    #: the client may send another request on this connection
    keep_alive: bool
    #: the client asked to switch protocols (Connection: upgrade + Upgrade, or CONNECT)
    upgrade: bool
    #: ``Expect: 100-continue``: the client waits for an interim answer before sending its body
    expects_continue: bool
    #: a body follows the head (Content-Length > 0, or chunked)
    has_body: bool


@attrs.frozen(slots=True)
class Response:
    status: int
    http_version: str
    headers: Headers


class _Parser:
    """What both directions share: the event queue, head size accounting, EOF and errors."""

    _make: type[httptools.HttpRequestParser] | type[httptools.HttpResponseParser]

    def __init__(self, *, max_head: int) -> None:
        self.max_head = max_head
        self._events: deque[object] = deque()
        self._parser = self._make(self)
        self._error: RemoteProtocolError | None = None
        self._url = b""
        self._headers: Headers = []
        self._head_size = 0
        #: between a message's first byte and the end of its head
        self._in_head = False
        #: between a message's first byte and its end
        self._in_message = False
        #: the current message's body ends when the connection closes
        self._until_eof = False
        #: parsing stopped for a protocol switch (or a bodiless answer); later bytes go to ``trailing``
        self._paused = False
        self._closed = False
        #: bytes received after the parser stopped (an upgrade): the other protocol's
        self.trailing = b""

    # -- input

    def feed(self, data: bytes | bytearray) -> None:
        if self._error is not None:
            return  # nothing after a malformed message is parsed (or kept)
        if self._paused:
            self.trailing += data
            return
        if not data:
            self.feed_eof()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            self._paused = True
            self.trailing = bytes(data[exc.args[0]:])
            return
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if not isinstance(cause, _Stop):
                self._error = cause if isinstance(cause, RemoteProtocolError) else _malformed(str(cause or exc))
            return
        except httptools.HttpParserError as exc:
            self._error = _malformed(f"malformed HTTP/1.1: {exc}")
            return
        if self._in_head:
            # llhttp keeps an incomplete head's pieces: bound them here (a whole head is measured
            # when it completes).
            self._head_size += len(data)
            if self._head_size > self.max_head:
                self._error = _malformed(f"head larger than {self.max_head} bytes", 431)

    def feed_eof(self) -> None:
        if self._closed or self._paused or self._error is not None:
            self._closed = True
            return
        self._closed = True
        if not self._in_message:
            self._events.append(CLOSED)
        elif self._until_eof and not self._in_head:
            self._in_message = False
            self._events.append(END)
        else:
            self._error = _malformed("connection closed in the middle of a message")

    # -- output

    def next_event(self) -> object:
        events = self._events
        if events:
            return events.popleft()
        if self._error is not None:
            raise self._error
        return NEED_DATA

    def start_next_cycle(self) -> None:
        """After a message that stopped the parser without a switch (an upgrade that was refused, a
        ``HEAD`` answer), go on parsing HTTP from the bytes that followed."""
        if not self._paused:
            return
        self._paused = False
        self._in_message = self._in_head = self._until_eof = False
        self._parser = self._make(self)
        trailing, self.trailing = self.trailing, b""
        if trailing:
            self.feed(trailing)

    # -- llhttp callbacks

    def on_message_begin(self) -> None:
        self._in_message = self._in_head = True
        self._url = b""
        self._headers = []
        self._head_size = 0

    def on_url(self, piece: bytes) -> None:
        self._url += piece

    def on_header(self, name: bytes, value: bytes) -> None:
        # llhttp drops the whitespace before a value, not after it; neither is part of the value.
        self._headers.append((name.decode("latin-1").lower(), value.decode("latin-1").rstrip(" \t")))

    def _measured_head(self) -> Headers:
        headers = self._headers
        size = len(self._url) + 4 * len(headers)
        for k, v in headers:  # a loop, not sum(generator): a generator is a Python call per header
            size += len(k) + len(v)
        if size > self.max_head:
            raise _malformed(f"head larger than {self.max_head} bytes", 431)
        self._in_head = False
        return headers

    def on_body(self, data: bytes) -> None:
        if data:
            self._events.append(data)

    def on_message_complete(self) -> None:
        self._in_message = False
        self._events.append(END)


class RequestParser(_Parser):
    """Requests from a client (a server's side)."""

    _make = httptools.HttpRequestParser
    _parser: httptools.HttpRequestParser

    def on_headers_complete(self) -> None:
        headers = self._measured_head()
        parser = self._parser
        version = parser.get_http_version()
        method = parser.get_method().decode("ascii")
        expects_continue = has_body = False
        for name, value in headers:
            if name == "content-length":
                has_body = value.strip() != "0"
            elif name == "transfer-encoding":
                has_body = True
            elif name == "expect":
                expects_continue = value.strip().lower() == "100-continue" and version == "1.1"
        self._events.append(Request(
            method=method,
            target=self._url.decode("latin-1"),
            http_version=version,
            headers=headers,
            keep_alive=version == "1.1" and parser.should_keep_alive(),
            upgrade=parser.should_upgrade(),
            expects_continue=expects_continue and has_body,
            has_body=has_body,
        ))


class ResponseParser(_Parser):
    """Responses from a server (a client's side). Interim answers (``100 Continue``) are skipped;
    ``101`` is reported, and parsing stops there. Call ``expect(method)`` before each response:
    the answer to a ``HEAD`` has no body, whatever its Content-Length says."""

    _make = httptools.HttpResponseParser
    _parser: httptools.HttpResponseParser

    def __init__(self, *, max_head: int) -> None:
        super().__init__(max_head=max_head)
        self._head_request = False
        self._interim = False
        #: the last response allows another request on this connection
        self.keep_alive = False

    def expect(self, method: str) -> None:
        self._head_request = method == "HEAD"

    def on_headers_complete(self) -> None:
        headers = self._measured_head()
        parser = self._parser
        status = parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            self._interim = True  # llhttp ends it here, and the real answer follows
            return
        self._events.append(Response(status=status, http_version=parser.get_http_version(), headers=headers))
        self.keep_alive = parser.should_keep_alive()
        if self._head_request:
            # No body comes; llhttp would wait for Content-Length bytes. Stop, and restart the
            # parser for the next response (``start_next_cycle``).
            self._in_message = False
            self._paused = True
            self._events.append(END)
            raise _Stop
        self._until_eof = status not in (204, 304) and status != 101 and _FRAMED.isdisjoint(dict(headers))
        if self._until_eof:
            self.keep_alive = False

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            self._in_message = False
            return
        super().on_message_complete()


#: the headers that say where a response's body ends (without them, it runs until the close)
_FRAMED = frozenset(("content-length", "transfer-encoding"))


class _Stop(Exception):
    """Raised from a callback to stop llhttp on purpose (after a HEAD answer's head); not an error."""


# ---------------------------------------------------------------------------------- sending

_TOKEN = re.compile(rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]|^[ \t]|[ \t]$")
_BAD_TARGET = re.compile(rb"[\x00-\x20\x7f]")
_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}


#: the header lines as ``_header_lines`` checks them all at once, each written ``name\x00value\n``:
#: a token name, then a value without control characters (tab allowed) and without space or tab at
#: either end. Neither part can hold NUL or LF, so when the block has exactly one LF per header, its
#: lines are the headers one for one, each split at its only NUL.
_GOOD_LINES = re.compile(
    rb"(?:[-!#$%&'*+.^_`|~0-9A-Za-z]+\x00(?:[\x21-\x7e\x80-\xff](?:[\x09\x20-\x7e\x80-\xff]*[\x21-\x7e\x80-\xff])?)?\n)*"
)


def _header_lines(headers: Headers, out: list[bytes]) -> None:
    # The usual head is checked as one block: one encode and one match, where checking line by line
    # cost five calls a header (~100 per request to the API server). A block the pattern refuses is
    # checked line by line below, which names the header at fault.
    try:
        block = "".join([f"{name}\x00{value}\n" for name, value in headers]).encode("latin-1")
    except UnicodeEncodeError:
        pass
    else:
        if block.count(b"\n") == len(headers) and _GOOD_LINES.fullmatch(block):
            out.append(block.replace(b"\x00", b": ").replace(b"\n", b"\r\n"))
            out.append(b"\r\n")
            return
    for name, value in headers:
        try:
            raw_name = name.encode("latin-1")
            raw_value = value.encode("latin-1")
        except UnicodeEncodeError:
            raw_name = raw_value = b"\x00"
        if not _TOKEN.fullmatch(raw_name) or _BAD_VALUE.search(raw_value):
            raise FramingError(f"illegal header {name[:100]!r}: {value[:100]!r}")
        out.append(raw_name + b": " + raw_value + b"\r\n")
    out.append(b"\r\n")


def encode_request_head(method: str, target: str, headers: Headers) -> bytes:
    try:
        raw_method = method.encode("latin-1")
        raw_target = target.encode("latin-1")
    except UnicodeEncodeError:
        raise FramingError(f"illegal characters in {method[:20]} {target[:100]!r}") from None
    if not _TOKEN.fullmatch(raw_method):
        raise FramingError(f"illegal method {method[:100]!r}")
    if not raw_target or _BAD_TARGET.search(raw_target):
        raise FramingError(f"illegal request target {target[:100]!r}")
    out = [raw_method + b" " + raw_target + b" HTTP/1.1\r\n"]
    _header_lines(headers, out)
    return b"".join(out)


def encode_response_head(status: int, headers: Headers) -> bytes:
    out = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b""))]
    _header_lines(headers, out)
    return b"".join(out)


class BodyWriter:
    """Frames one outgoing body: counted against its Content-Length, chunked, or until the close.

    ``data``/``end`` return the bytes to send; a body that does not match its Content-Length
    raises ``FramingError`` (the only honest answer then is to cut the connection)."""

    __slots__ = ("_chunked", "_drop", "_remaining")

    def __init__(self, *, length: int | None, chunked: bool, drop: bool = False) -> None:
        self._remaining = length
        self._chunked = chunked
        self._drop = drop

    @classmethod
    def for_headers(cls, headers: Headers, *, no_body: bool = False) -> BodyWriter:
        """The framing ``headers`` declare; a body without Content-Length or chunked runs until close.
        ``no_body`` (the answer to HEAD, a 204 or 304): whatever body comes is dropped, not sent."""
        if no_body:
            return cls(length=None, chunked=False, drop=True)
        chunked = False
        length: int | None = None
        for name, value in headers:
            if name == "content-length":
                try:  # ASCII digits only: int() also takes " 7", "7_0" and "+7", which a client reads otherwise
                    length = parse_decimal(value, "Content-Length")
                except InvalidNumber:
                    raise FramingError(f"illegal Content-Length {value[:100]!r}") from None
            elif name == "transfer-encoding":
                chunked = True
        return cls(length=None if chunked else length, chunked=chunked)

    def data(self, chunk: bytes) -> bytes:
        size = len(chunk)
        if not size or self._drop:
            return b""
        if self._chunked:
            return b"%x\r\n%b\r\n" % (size, chunk)
        if self._remaining is not None:
            if size > self._remaining:
                raise FramingError(f"{size - self._remaining} bytes more than the declared Content-Length")
            self._remaining -= size
        return chunk

    def end(self) -> bytes:
        if self._chunked:
            return b"0\r\n\r\n"
        if self._remaining:
            raise FramingError(f"body ended {self._remaining} bytes short of its Content-Length")
        return b""
