"""http11: the HTTP/1.1 framing both daemons speak on their outer hops (llhttp parses, we frame)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import http11
from http11 import CLOSED, END, NEED_DATA, BodyWriter, FramingError, ProtocolError

GET = b"GET /api/v1/pods?watch=1 HTTP/1.1\r\nHost: kas\r\nAccept: application/json\r\n\r\n"


def events(parser: http11.RequestParser | http11.ResponseParser) -> list[object]:
    """Every event up to NEED_DATA/CLOSED, an error as ("error", status, message)."""
    out: list[object] = []
    while True:
        try:
            event = parser.next_event()
        except ProtocolError as exc:
            out.append(("error", exc.status, str(exc)))
            return out
        out.append(event)
        if event is NEED_DATA or event is CLOSED:
            return out


def joined(evs: list[object]) -> list[object]:
    """Events with adjacent body pieces joined (how data is split is the transport's business)."""
    out: list[object] = []
    for event in evs:
        if type(event) is bytes and out and type(out[-1]) is bytes:
            out[-1] += event
        elif event is not NEED_DATA:
            out.append(event)
    return out


def feed_in_pieces(parser: http11.RequestParser | http11.ResponseParser, data: bytes, cuts: list[int]) -> list[object]:
    out: list[object] = []
    last = 0
    for cut in [*sorted({c for c in cuts if 0 < c < len(data)}), len(data)]:
        parser.feed(data[last:cut])  # (never an empty piece: that would mean EOF)
        last = cut
        out += events(parser)
    return joined(out)


def request(data: bytes, max_head: int = 8192) -> list[object]:
    parser = http11.RequestParser(max_head=max_head)
    parser.feed(data)
    return events(parser)


def test_a_request_head_is_parsed_with_lower_case_names_and_what_the_server_must_know() -> None:
    head, end, need = request(GET)
    assert head == http11.Request(
        method="GET", target="/api/v1/pods?watch=1", http_version="1.1",
        headers=[("host", "kas"), ("accept", "application/json")],
        keep_alive=True, upgrade=False, expects_continue=False, has_body=False,
    )
    assert (end, need) == (END, NEED_DATA)


def test_whitespace_around_a_header_value_is_not_part_of_it() -> None:
    # (agentd refuses to send a value with surrounding whitespace: it must not get one from here)
    head, *_ = request(b"GET / HTTP/1.1\r\nHost: k\r\nX-A:  b c \t\r\nX-B: \r\n\r\n")
    assert head.headers == [("host", "k"), ("x-a", "b c"), ("x-b", "")]
    http11.encode_request_head("GET", "/", head.headers)


def test_pipelined_requests_come_out_in_order_and_eof_between_them_is_a_clean_close() -> None:
    parser = http11.RequestParser(max_head=8192)
    parser.feed(GET + b"DELETE /x HTTP/1.1\r\nHost: kas\r\nContent-Length: 2\r\n\r\nhi")
    first, end1, second, body, end2, need = events(parser)
    assert (first.method, second.method, body) == ("GET", "DELETE", b"hi")
    assert (end1, end2, need) == (END, END, NEED_DATA)
    parser.feed(b"")
    assert events(parser) == [CLOSED]


@given(st.lists(st.integers(min_value=0, max_value=200), max_size=8))
def test_a_message_stream_parses_the_same_however_the_bytes_are_split(cuts: list[int]) -> None:
    data = (GET + b"POST /a HTTP/1.1\r\nHost: k\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n" + GET)
    whole = feed_in_pieces(http11.RequestParser(max_head=8192), data, [])
    assert feed_in_pieces(http11.RequestParser(max_head=8192), data, cuts) == whole
    assert [e for e in whole if type(e) is bytes] == [b"abcdefg"]
    assert [e.method for e in whole if type(e) is http11.Request] == ["GET", "POST", "GET"]


def test_an_upgrade_stops_the_parser_and_keeps_the_new_protocols_bytes() -> None:
    parser = http11.RequestParser(max_head=8192)
    parser.feed(b"GET /exec HTTP/1.1\r\nHost: k\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n\x82\x05hel")
    head, end, need = events(parser)
    assert head.upgrade and (end, need) == (END, NEED_DATA)
    parser.feed(b"lo")
    assert events(parser) == [NEED_DATA]
    assert parser.trailing == b"\x82\x05hello"


def test_after_a_refused_upgrade_http_goes_on_with_the_bytes_that_followed() -> None:
    parser = http11.RequestParser(max_head=8192)
    parser.feed(b"GET /exec HTTP/1.1\r\nHost: k\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n" + GET[:20])
    assert [type(e) for e in events(parser)] == [http11.Request, type(END), type(NEED_DATA)]
    parser.start_next_cycle()
    parser.feed(GET[20:])
    head, end, _ = events(parser)
    assert head.target == "/api/v1/pods?watch=1" and end is END


@pytest.mark.parametrize("data, status, words", [
    (b"\x16\x03\x01\x00\xa5garbage\r\n\r\n", 400, "Invalid method"),
    (b"POST / HTTP/1.1\r\nHost: k\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "Transfer-Encoding"),
    (b"POST / HTTP/1.1\r\nHost: k\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400, "Content-Length"),
    (b"GET / HTTP/1.1\r\nHost k\r\n\r\n", 400, "header"),
    (b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 300 + b"\r\n\r\n", 431, "head larger than 256 bytes"),
    (b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 300, 431, "head larger than 256 bytes"),
])
def test_malformed_and_oversized_requests_are_errors_that_name_the_problem(data: bytes, status: int, words: str) -> None:
    *before, error = request(data, max_head=256)
    assert error[:2] == ("error", status) and words in error[2]
    assert not [e for e in before if type(e) is http11.Request]


def test_an_error_comes_after_the_events_before_it_and_stays() -> None:
    parser = http11.RequestParser(max_head=8192)
    parser.feed(GET + b"BREW /pot HTCPCP/1.0\r\n\r\n")
    head, end, error = events(parser)
    assert type(head) is http11.Request and end is END and error[0] == "error"
    parser.feed(GET)
    assert events(parser)[0][0] == "error"


def test_eof_inside_a_body_is_an_error_not_an_end() -> None:
    parser = http11.RequestParser(max_head=8192)
    parser.feed(b"PUT /x HTTP/1.1\r\nHost: k\r\nContent-Length: 10\r\n\r\nabc")
    parser.feed(b"")
    *_, error = events(parser)
    assert error == ("error", 400, "connection closed in the middle of a message")


def test_expect_continue_and_http10_are_reported() -> None:
    head, *_ = request(b"PUT /x HTTP/1.1\r\nHost: k\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
    assert head.expects_continue and head.has_body and head.keep_alive
    head, *_ = request(b"GET /x HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    assert head.http_version == "1.0" and not head.keep_alive  # no chunks in 1.0: we close instead
    head, *_ = request(b"GET /x HTTP/1.1\r\nHost: k\r\nConnection: close\r\n\r\n")
    assert not head.keep_alive


# ---------------------------------------------------------------------------------- responses


def response(method: str, *chunks: bytes) -> tuple[http11.ResponseParser, list[object]]:
    parser = http11.ResponseParser(max_head=8192)
    parser.expect(method)
    out: list[object] = []
    for chunk in chunks:
        parser.feed(chunk)
        out += events(parser)
    return parser, joined(out)


def test_interim_answers_are_skipped() -> None:
    _, evs = response("PUT", b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok")
    assert evs == [http11.Response(201, "1.1", [("content-length", "2")]), b"ok", END]


def test_a_101_stops_the_parser_with_the_new_protocols_bytes_as_trailing() -> None:
    parser, evs = response("GET", b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n\x80\x03")
    assert [type(e) for e in evs] == [http11.Response, type(END)] and evs[0].status == 101
    parser.feed(b"\x00\x01")
    assert parser.trailing == b"\x80\x03\x00\x01"


def test_the_answer_to_head_has_no_body_and_the_next_answer_parses() -> None:
    # Bytes after the head (a server that should not have sent them) are not taken as its body.
    parser, evs = response("HEAD", b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\nstray")
    assert evs == [http11.Response(200, "1.1", [("content-length", "1234")]), END] and parser.keep_alive
    parser.start_next_cycle()
    parser.expect("GET")
    parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi")
    assert joined(events(parser)) == [http11.Response(200, "1.1", [("content-length", "2")]), b"hi", END]


def test_a_body_without_length_runs_to_eof_and_the_connection_is_not_reused() -> None:
    parser, evs = response("GET", b"HTTP/1.1 200 OK\r\n\r\nsome", b"thing", b"")
    assert evs[1:] == [b"something", END] and not parser.keep_alive
    parser, evs = response("GET", b"HTTP/1.1 204 No Content\r\n\r\n")
    assert evs[1:] == [END] and parser.keep_alive


def test_a_short_counted_body_at_eof_is_an_error() -> None:
    _, evs = response("GET", b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc", b"")
    assert evs[-1] == ("error", 400, "connection closed in the middle of a message")


# ---------------------------------------------------------------------------------- sending


def test_counted_bodies_are_held_to_their_content_length() -> None:
    writer = BodyWriter.for_headers([("content-length", "5")])
    assert writer.data(b"abc") == b"abc"
    with pytest.raises(FramingError, match="3 bytes more"):
        writer.data(b"defgh")
    with pytest.raises(FramingError, match="2 bytes short"):
        writer.end()
    # what int() takes but a client would read otherwise (or not at all) is no length either
    for bad in ("-1", " 5", "5_0", "+5", "\u00b2", "5" * 5000):
        with pytest.raises(FramingError, match="Content-Length"):
            BodyWriter.for_headers([("content-length", bad)])


@given(st.lists(st.binary(max_size=300), max_size=6), st.lists(st.integers(min_value=0, max_value=2000), max_size=6))
def test_what_the_writers_frame_the_parser_reads_back(chunks: list[bytes], cuts: list[int]) -> None:
    headers = [("host", "k"), ("transfer-encoding", "chunked")]
    writer = BodyWriter.for_headers(headers)
    data = http11.encode_request_head("POST", "/api/v1/namespaces/a/configmaps", headers)
    data += b"".join(writer.data(c) for c in chunks) + writer.end()
    evs = feed_in_pieces(http11.RequestParser(max_head=8192), data, cuts)
    body = b"".join(chunks)
    assert evs == [evs[0], body, END] if body else evs == [evs[0], END]
    assert evs[0].headers == headers and evs[0].target == "/api/v1/namespaces/a/configmaps"


@pytest.mark.parametrize("headers", [
    [("x-evil", "a\r\nset-cookie: b")],
    [("x-evil", "a\nset-cookie: b")],
    [("x-evil", "a\nset-cookie\x00b")],
    [("x-evil: a", "b")],
    [("x-evil\x00a", "b")],
    [("x evil", "a")],
    [("x-evil", "\x00")],
    [("x-name", "é€")],
])
def test_a_header_that_would_break_the_message_is_refused(headers: list[tuple[str, str]]) -> None:
    with pytest.raises(FramingError, match="illegal header"):
        http11.encode_response_head(200, headers)
    with pytest.raises(FramingError, match="illegal header"):
        http11.encode_request_head("GET", "/", headers)


_HEADER_TEXT = st.text(alphabet="aZ9-_:; \t\r\n\x00\x7fé€", max_size=6)


def _line_by_line(headers: list[tuple[str, str]]) -> bytes | None:
    """The header block as RFC 9110 allows it, one line at a time (None: a header is illegal)."""
    import re

    out = b""
    for name, value in headers:
        try:
            raw_name, raw_value = name.encode("latin-1"), value.encode("latin-1")
        except UnicodeEncodeError:
            return None
        if not re.fullmatch(rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+", raw_name) or re.search(
                rb"[\x00-\x08\x0a-\x1f\x7f]|^[ \t]|[ \t]$", raw_value):
            return None
        out += raw_name + b": " + raw_value + b"\r\n"
    return out + b"\r\n"


@given(st.lists(st.tuples(_HEADER_TEXT, _HEADER_TEXT), max_size=5))
def test_header_lines_are_framed_or_refused_as_one_line_at_a_time_would(headers: list[tuple[str, str]]) -> None:
    # The framer checks a whole head at once; what it sends or refuses must be what checking each
    # line would (no line hidden in another's name or value: CR, LF, NUL, a colon in a name).
    expected = _line_by_line(headers)
    if expected is None:
        with pytest.raises(FramingError, match="illegal header"):
            http11.encode_response_head(200, headers)
    else:
        assert http11.encode_response_head(200, headers) == b"HTTP/1.1 200 OK\r\n" + expected


def test_a_request_line_that_would_break_the_message_is_refused() -> None:
    for method, target in [("GET", "/a b"), ("GET", "/a\r\nx"), ("GE T", "/"), ("GET", "")]:
        with pytest.raises(FramingError):
            http11.encode_request_head(method, target, [])
    assert http11.encode_response_head(599, []) == b"HTTP/1.1 599 \r\n\r\n"


def test_errors_are_the_one_protocol_error_family() -> None:
    import wire.errors

    parser = http11.RequestParser(max_head=64)
    parser.feed(b"NOT HTTP\r\n\r\n")
    with pytest.raises(wire.errors.RemoteProtocolError) as info:
        while parser.next_event() is not NEED_DATA:
            pass
    assert http11.ProtocolError is wire.errors.ProtocolError
    assert info.value.status == 400 and str(info.value) == info.value.message  # HTTP texts stay as they were


def test_http11_imports_nothing_that_uses_trio() -> None:
    import subprocess
    import sys

    code = "import sys, http11; print(sorted(m for m in sys.modules if m.split('.')[0] in ('trio', 'h2', 'netio')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.strip() == "[]"
