"""What only the WebSocket carrier has: its HTTP/1.1 answers before any upgrade, and its bounds on
what a stranger may send (what it shares with HTTP/2 runs over both in test_h2carrier.py)."""

from __future__ import annotations

import base64
import os
import re
from functools import partial
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest
import trio
import trio.testing
import wsproto
import wsproto.connection
import wsproto.events
from wsproto.frame_protocol import CloseReason

from h2trio.budget import DEFAULT_RESET_LIMIT
from tests.wire.test_h2carrier import TOKEN, _exchange, _read_until_closed, _start
from wire.h2carrier import _serve_connection
from wire.wscarrier import MAX_HEAD, WebSocketTransport, open_ws_session


def _upgrade_head(method: str = "GET", path: str = "/tunnel", token: str | None = TOKEN, upgrade: bool = True) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    if upgrade:
        key = base64.b64encode(os.urandom(16)).decode()
        lines += ["Upgrade: websocket", "Connection: Upgrade", f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def _ask(port: int, head: bytes) -> bytes:
    """Send a request head; the whole answer, up to the server's close."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(head)
    with trio.fail_after(5):
        return await _read_until_closed(stream)


@pytest.mark.parametrize(
    ("head", "status", "reason", "header"),
    [
        # The same statuses and reasons as over HTTP/2 (wire.carrier), the method being GET here.
        (_upgrade_head(method="POST"), 405, b"tunnel endpoint takes GET, not POST", b"allow: GET"),
        (_upgrade_head(path="/elsewhere"), 404, b"no tunnel endpoint at '/elsewhere'", b""),
        (_upgrade_head(token=None), 401, b"missing bearer token", b"www-authenticate: Bearer"),
        (_upgrade_head(token="wrong"), 401, b"invalid token", b"www-authenticate: Bearer"),
        # A plain HTTP/1.1 client is told what the port speaks.
        (_upgrade_head(upgrade=False), 426, b"takes a WebSocket upgrade over HTTP/1.1 (or HTTP/2", b"upgrade: websocket"),
        (_upgrade_head().replace(b"\r\n\r\n", b"\r\nContent-Length: 3\r\n\r\nabc"), 400,
         b"a WebSocket upgrade request has no body", b""),
        (_upgrade_head().replace(b"HTTP/1.1", b"HTTP/1.0"), 400, b"a WebSocket upgrade needs HTTP/1.1", b""),
        # Which of two a proxy in front looked at is unknowable: twice is refused, whatever the order.
        (_upgrade_head().replace(b"Host:", b"Authorization: Bearer wrong\r\nHost:"), 400,
         b"more than one authorization header", b""),
        (_upgrade_head(token="wrong").replace(b"Host:", f"Authorization: Bearer {TOKEN}\r\nHost:".encode()), 400,
         b"more than one authorization header", b""),
        (_upgrade_head().replace(b"Host:", b"Sec-WebSocket-Key: AAAAAAAAAAAAAAAAAAAAAA==\r\nHost:"), 400,
         b"more than one sec-websocket-key header", b""),
        (re.sub(rb"Sec-WebSocket-Key: [^\r]*", b"Sec-WebSocket-Key: x", _upgrade_head()), 400,
         b"Sec-WebSocket-Key is not the base64 of 16 bytes", b""),
        # A head larger than the bound is refused before it is read whole.
        (_upgrade_head() + b"X-Pad: " + b"a" * MAX_HEAD + b"\r\n\r\n", 431, b"request head too large", b""),
    ],
    ids=["method", "path", "no-token", "bad-token", "no-upgrade", "body", "http-1.0", "two-tokens", "two-tokens-reversed",
         "two-keys", "bad-key", "huge-head"],
)
async def test_bad_upgrade_requests_get_plain_http_answers_and_the_connection_closes(
        nursery: trio.Nursery, head: bytes, status: int, reason: bytes, header: bytes) -> None:
    server = await _start(nursery)
    if status == 431:
        head = head.replace(b"\r\n\r\nX-Pad", b"\r\nX-Pad", 1)  # the padding inside the head
    answer = await _ask(server.port, head)
    assert answer.startswith(b"HTTP/1.1 %d " % status), answer[:80]
    assert reason in answer and header.lower() in answer.lower()
    assert TOKEN.encode() not in answer
    assert server.sessions == [] and (status != 401 or b"Bearer wrong" not in answer)


async def test_a_stranger_that_never_finishes_its_upgrade_is_cut_at_the_handshake_timeout(nursery: trio.Nursery) -> None:
    server = await _start(nursery, handshake_timeout=0.5)
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(b"GET /tunnel HTTP/1.1\r\nHost: x\r\n")  # and never ends the head
    async with open_ws_session(f"ws://127.0.0.1:{server.port}/tunnel", token=TOKEN) as session:
        with trio.fail_after(3):
            for _ in range(3):  # bytes now and then do not extend the deadline
                await stream.send_all(b"X-Slow: 1\r\n")
                assert await _exchange(session, b"still served") == b"STILL SERVED"
            assert await _read_until_closed(stream) == b""


async def _server_transport(max_message: int) -> tuple[WebSocketTransport, wsproto.WSConnection, trio.abc.Stream]:
    """A server's transport over memory, and the client's wsproto and stream to speak to it."""
    client_stream, server_stream = trio.testing.memory_stream_pair()
    transport = WebSocketTransport(server_stream, wsproto.connection.Connection(wsproto.ConnectionType.SERVER),
                                   max_message=max_message)
    client = wsproto.connection.Connection(wsproto.ConnectionType.CLIENT)
    return transport, client, client_stream  # type: ignore[return-value]


async def _close_code(client: Any, stream: trio.abc.Stream) -> int:
    while True:
        client.receive_data(await stream.receive_some())
        for event in client.events():
            if isinstance(event, wsproto.events.CloseConnection):
                return int(event.code)


@pytest.mark.parametrize(
    ("message", "code"),
    [
        (wsproto.events.BytesMessage(data=b"x" * 1025), CloseReason.MESSAGE_TOO_BIG),
        (wsproto.events.TextMessage(data="hello"), CloseReason.UNSUPPORTED_DATA),
    ],
    ids=["oversized", "text"],
)
async def test_an_oversized_or_text_message_closes_the_websocket(message: wsproto.events.Event, code: int) -> None:
    transport, client, stream = await _server_transport(max_message=1024)
    with trio.fail_after(5):
        await stream.send_all(client.send(wsproto.events.BytesMessage(data=b"fine", message_finished=True)))
        await stream.send_all(client.send(message))
        assert await transport.receive_some() == b"fine"  # what came before still reaches the session
        async with trio.open_nursery() as nursery:
            codes: list[int] = []

            async def read_close() -> None:
                codes.append(await _close_code(client, stream))

            nursery.start_soon(read_close)
            with pytest.raises(trio.BrokenResourceError):
                await transport.receive_some()
    assert codes == [code]


_MASK = b"\x00\x00\x00\x00"  # a zero mask: the payload goes as it is


@pytest.mark.parametrize(
    "frame",
    [
        b"\x82\x03abc",  # a client's frame unmasked
        b"\x09\x80" + _MASK,  # a fragmented control frame (PING without FIN)
        b"\x88\x82" + _MASK + (999).to_bytes(2, "big"),  # a close with a code no one may send
        b"\x83\x80" + _MASK,  # a reserved opcode
    ],
    ids=["unmasked", "fragmented-ping", "bad-close-code", "reserved-opcode"],
)
async def test_a_frame_breaking_the_protocol_is_answered_with_close_1002(frame: bytes) -> None:
    """The server closes with 1002 (RFC 6455 7.4.1) and says it was the peer's protocol error, not
    that the peer closed."""
    transport, client, stream = await _server_transport(max_message=1024)
    with trio.fail_after(5):
        await stream.send_all(frame)
        async with trio.open_nursery() as nursery:
            codes: list[int] = []

            async def read_close() -> None:
                codes.append(await _close_code(client, stream))

            nursery.start_soon(read_close)
            with pytest.raises(trio.BrokenResourceError) as failed:
                await transport.receive_some()
    assert codes == [CloseReason.PROTOCOL_ERROR]
    assert "protocol error" in str(failed.value) and "closed by the peer" not in str(failed.value)


async def test_list_headers_given_twice_are_joined(nursery: trio.Nursery) -> None:
    """``Connection: Upgrade`` then ``Connection: keep-alive`` say ``Upgrade, keep-alive`` (RFC 9110
    5.3): the upgrade is taken whatever the order the client's library wrote them in."""
    server = await _start(nursery)
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(_upgrade_head().replace(b"Connection: Upgrade\r\n", b"Connection: Upgrade\r\nConnection: keep-alive\r\n"))
    with trio.fail_after(5):
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += await stream.receive_some()
    assert answer.startswith(b"HTTP/1.1 101 ")
    await stream.aclose()



@pytest.mark.parametrize("split", [1, 3, 16], ids=["P", "PRI", "PRI-line"])
async def test_an_http2_preface_that_arrives_in_pieces_is_http2(split: int) -> None:
    """An h2c client whose first segment holds only the start of the preface ("PRI" could begin an
    HTTP/1.1 method) is still served HTTP/2, on the port that takes both carriers."""
    client, server = trio.testing.memory_stream_pair()
    principals: list[Any] = []

    async def handler(session: Any, principal: Any) -> None:
        principals.append(principal)

    async def authenticate(token: str, headers: dict[str, str]) -> Any:
        await trio.lowlevel.checkpoint()
        return {"agent_id": 42} if token == TOKEN else None

    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    conn.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":authority", "x"), (":path", "/tunnel"),
                          ("authorization", f"Bearer {TOKEN}")])
    data = conn.data_to_send()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(_serve_connection, server, handler=handler, authenticate=authenticate,
                                       path="/tunnel", ssl_context=None, handshake_timeout=5, reset_limit=DEFAULT_RESET_LIMIT,
                                       session_kwargs={}, websocket=True))
            await client.send_all(data[:split])
            await trio.testing.wait_all_tasks_blocked()  # the server has read only these
            await client.send_all(data[split:])
            response: dict[str, str] = {}
            while not response:
                for event in conn.receive_data(await client.receive_some()):
                    if isinstance(event, h2.events.ResponseReceived):
                        response = dict(event.headers)  # type: ignore[arg-type]
            await client.aclose()
    assert response[":status"] == "200"
