"""kasd.asgiport: an ASGI app on the proxy port's HTTP/1.1 front end, over an in-memory connection."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
import trio
import trio.testing

from kasd.asgiport import AsgiPort, PortLimits

pytestmark = pytest.mark.timeout(10)

Scope = dict[str, Any]


async def _app(scope: Scope, receive: Any, send: Any) -> None:
    path = scope["path"]
    if path == "/fail":
        raise RuntimeError("a bug")
    body = b""
    while True:
        message = await receive()
        body += message["body"]
        if not message["more_body"]:
            break
    if path.startswith("/stream"):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x-raw", scope["raw_path"])]})
        await send({"type": "http.response.body", "body": b"one,", "more_body": True})
        await send({"type": "http.response.body", "body": b"two"})
        return
    answer = repr((scope["method"], path, scope["query_string"], len(body))).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": answer})


async def _converse(data: bytes, limits: PortLimits | None = None) -> bytes:
    """``data`` sent on one connection; all the port answers until it closes it."""
    client, server = trio.testing.memory_stream_pair()
    port = AsgiPort(_app, limits=limits or PortLimits(), log=logging.getLogger("kasd.api"))
    out = b""
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(port.handle_connection, server)
            await client.send_all(data)
            while chunk := await client.receive_some(65536):
                out += chunk
    return out


async def test_requests_reach_the_app_as_asgi_scopes_and_answers_are_framed(caplog: pytest.LogCaptureFixture) -> None:
    answer = await _converse(
        b"GET /a%20b?x=1 HTTP/1.1\r\nHost: k\r\n\r\n"
        b"POST /stream/%2F HTTP/1.1\r\nHost: k\r\nContent-Length: 3\r\n\r\nabc"
        b"GET /fail HTTP/1.1\r\nHost: k\r\n\r\n"
        b"GET /last HTTP/1.1\r\nHost: k\r\nConnection: close\r\n\r\n"
    )
    first, rest = answer.split(b"\r\n\r\n", 1)
    assert first.startswith(b"HTTP/1.1 200 ") and b"content-length: 26" in first
    assert rest.startswith(b"('GET', '/a b', b'x=1', 0)")
    # a streamed answer is chunked, and the connection goes on after it
    assert re.search(rb"x-raw: /stream/%2F\r\nx-request-id: [0-9a-f]{32}\r\n"
                     rb"transfer-encoding: chunked\r\n\r\n4\r\none,\r\n3\r\ntwo\r\n0\r\n\r\n", rest)
    # an app that fails before answering: 500, logged, and the connection still serves the next request
    assert b"HTTP/1.1 500 " in rest and b'{"message":"500 Internal Server Error"}' in rest
    assert "the API failed method=GET path=/fail" in caplog.text
    assert rest.endswith(b"('GET', '/last', b'', 0)") and b"connection: close" in rest.split(b"/fail")[-1]


async def test_the_request_id_is_the_clients_when_safe_answered_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    """X-Request-Id: a short id of a safe charset is the request's, answered and in the access line;
    any other (too long, a space, a quote) is replaced by a new one and never logged or echoed."""
    caplog.set_level("INFO", logger="kasd.api")
    unsafe = [b"a" * 65, b'x" status=200 forged=1', b"id/with:colon"]
    answer = await _converse(
        b"GET /a HTTP/1.1\r\nHost: k\r\nX-Request-Id: job-42.try_1\r\n\r\n"
        + b"".join(b"GET /b HTTP/1.1\r\nHost: k\r\nX-Request-Id: %s\r\n\r\n" % u for u in unsafe)
        + b"GET /c HTTP/1.1\r\nHost: k\r\nConnection: close\r\n\r\n"
    )
    ids = re.findall(rb"\r\nx-request-id: ([^\r]*)\r\n", answer)
    assert ids[0] == b"job-42.try_1" and len(ids) == 5
    assert all(re.fullmatch(rb"[0-9a-f]{32}", i) for i in ids[1:]) and len(set(ids)) == 5
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("request ")]
    assert [line.split()[1] for line in lines] == [f"request_id={i.decode()}" for i in ids]
    assert "forged" not in caplog.text and "a" * 65 not in caplog.text


async def test_a_body_over_the_cap_is_413_and_never_read_as_a_request() -> None:
    smuggled = b"GET /smuggled HTTP/1.1\r\nHost: k\r\n\r\n"
    answer = await _converse(b"POST / HTTP/1.1\r\nHost: k\r\nContent-Length: %d\r\n\r\n" % len(smuggled) + smuggled
                             + b"GET /after HTTP/1.1\r\nHost: k\r\nConnection: close\r\n\r\n",
                             PortLimits(max_body_bytes=10))
    assert answer.startswith(b"HTTP/1.1 413 ") and b"the body is over 10 bytes" in answer
    assert b"/smuggled" not in answer and answer.endswith(b"('GET', '/after', b'', 0)")


async def test_a_target_that_is_not_a_path_is_400() -> None:
    answer = await _converse(b"GET http://example.com/ HTTP/1.1\r\nHost: k\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 ") and b"the request target must be a path" in answer


async def test_the_port_keeps_its_own_clocks_not_the_proxy_ports_verdict_rules(
        autojump_clock: trio.testing.MockClock) -> None:
    """The app checks a job token per call and tells the front end nothing: a connection is not
    held to the proxy port's head deadline or its cap on refused answers (``frontend.ConnectionClock``
    ``gated``), only to ``header_timeout`` for a head and ``idle_timeout`` between requests."""
    client, server = trio.testing.memory_stream_pair()
    limits = PortLimits(header_timeout=10.0, idle_timeout=30.0)
    port = AsgiPort(_app, limits=limits, log=logging.getLogger("kasd.api"))
    served = 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(port.handle_connection, server)
        for _ in range(6):  # more than the proxy port's 4 answers, well past 10 s from accept
            await client.send_all(b"GET /x HTTP/1.1\r\nHost: k\r\n\r\n")
            answer = await client.receive_some(65536)
            assert answer.startswith(b"HTTP/1.1 200 ") and b"connection: close" not in answer
            served += 1
            await trio.sleep(20)
        last = trio.current_time() - 20
        assert await client.receive_some(65536) == b""  # closed: idle since the last answer
    assert served == 6 and trio.current_time() == last + limits.idle_timeout
